//! Finds librbd's C header and, where it is installed (and the `rbd`
//! feature is on), generates the bindings and sets `cfg(have_librbd)`.
//! Elsewhere the crate builds without them and says so at open.

use std::env;
use std::path::PathBuf;

/// Where distributions put `rbd/librbd.h`; `LIBRBD_INCLUDE_DIR` goes first.
fn header_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = env::var_os("LIBRBD_INCLUDE_DIR") {
        dirs.push(PathBuf::from(dir));
    }
    dirs.push(PathBuf::from("/usr/include"));
    dirs.push(PathBuf::from("/usr/local/include"));
    dirs
}

fn find_header() -> Option<PathBuf> {
    header_dirs()
        .into_iter()
        .find(|dir| dir.join("rbd/librbd.h").is_file())
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(have_librbd)");
    println!("cargo::rerun-if-env-changed=LIBRBD_INCLUDE_DIR");
    println!("cargo::rerun-if-env-changed=LIBRBD_LIB_DIR");
    if env::var_os("CARGO_FEATURE_RBD").is_none() {
        return;
    }
    let Some(include) = find_header() else {
        println!("cargo::warning=librbd headers not found (install librbd-dev); building without RBD support");
        // Installing them later must bring RBD in at the next build: watch
        // where they would appear (a directory is scanned for changes).
        for dir in header_dirs().into_iter().filter(|d| d.is_dir()) {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
        return;
    };
    println!(
        "cargo::rerun-if-changed={}",
        include.join("rbd/librbd.h").display()
    );
    #[cfg(feature = "rbd")]
    generate(&include);
}

#[cfg(feature = "rbd")]
fn generate(include: &std::path::Path) {
    let bindings = bindgen::Builder::default()
        .header(include.join("rbd/librbd.h").display().to_string())
        .clang_arg(format!("-I{}", include.display()))
        // Only what the crate calls, so that the bindings stay small.
        .allowlist_function("rbd_.*")
        .allowlist_function("rados_(create2|conf_read_file|conf_set|connect|shutdown|ioctx_create|ioctx_destroy|ioctx_get_id)")
        .allowlist_type("rbd_.*")
        .allowlist_var("RBD_.*")
        .generate_comments(false)
        .layout_tests(false)
        .generate();
    let bindings = match bindings {
        Ok(b) => b,
        Err(e) => panic!(
            "generating librbd bindings from {}: {e} (is libclang-dev installed?)",
            include.display()
        ),
    };
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("librbd.rs"))
        .expect("writing the librbd bindings");
    if let Some(dir) = env::var_os("LIBRBD_LIB_DIR") {
        println!(
            "cargo::rustc-link-search=native={}",
            PathBuf::from(dir).display()
        );
    }
    println!("cargo::rustc-link-lib=rbd");
    println!("cargo::rustc-link-lib=rados");
    println!("cargo::rustc-cfg=have_librbd");
}
