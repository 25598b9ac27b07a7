//! The console's pages, scripts and styles, built into the binary.

use hyper::Response;

use crate::responses::{full, json_error};
use crate::{Body, Role};

const APP: &str = include_str!("../assets/app.html");

/// Scripts and styles by name under `/console/assets/`.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../assets/app.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/app.js"),
    ),
    (
        "icon.svg",
        "image/svg+xml",
        include_str!("../assets/icon.svg"),
    ),
    (
        "chart.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/chart.js"),
    ),
    (
        "pages.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/pages.js"),
    ),
    (
        "storage.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/storage.js"),
    ),
];

/// The console's page, saying which token it was logged in with.
pub fn app(role: Role) -> Response<Body> {
    let badge = match role {
        Role::Full => String::new(),
        Role::ReadOnly => {
            r#"<span class="badge" id="role" title="changes are refused">read-only</span>"#.into()
        }
    };
    full(
        200,
        "text/html; charset=utf-8",
        APP.replacen("<!--role-->", &badge, 1),
    )
}

pub fn asset(path: &str) -> Response<Body> {
    let name = path.trim_start_matches("/console/assets/");
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, text)) => full(200, content_type, *text),
        None => json_error(404, &format!("no such asset {name}")),
    }
}
