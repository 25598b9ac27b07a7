//! The `[nbd]` section: listen addresses, TLS files, and the exports with
//! the devices they serve and who may use them.

use std::path::PathBuf;

use toml::Spanned;

use super::Checker;
use crate::error::Location;
use crate::model::{Nbd, NbdExport, Portal, DEFAULT_NBD_LISTEN, DEFAULT_NBD_PORT};
use crate::raw::{RawNbd, RawNbdExport};

/// Longest export name or description the protocol carries.
const MAX_STRING: usize = 4096;

/// An NBD listen address as the section gives it.
fn listen_addr(s: &str) -> Result<export::ListenAddr, String> {
    export::ListenAddr::parse(s, DEFAULT_NBD_PORT)
}

impl Checker<'_> {
    pub(super) fn nbd(
        &mut self,
        raw: Option<Spanned<RawNbd>>,
        devices: &[String],
        portals: &[Portal],
    ) -> Option<Nbd> {
        let raw = raw?;
        let at = self.at(&raw.span());
        let raw = raw.into_inner();
        let listen = self.nbd_listen(raw.listen, portals);
        let tls = raw.tls.map(|t| {
            let t = t.into_inner();
            let mut path = |v: &Spanned<String>, name: &str| {
                if v.get_ref().trim().is_empty() {
                    self.fail(&v.span(), format!("nbd.tls.{name}"), "must name a PEM file");
                }
                PathBuf::from(v.get_ref())
            };
            export::TlsConfig {
                cert: path(&t.cert, "cert"),
                key: path(&t.key, "key"),
                require: t.require.unwrap_or(false),
            }
        });
        let mut exports: Vec<NbdExport> = Vec::new();
        // Each name with the line of its first table.
        let mut seen: Vec<(String, usize)> = Vec::new();
        for (i, entry) in raw.export.into_iter().enumerate() {
            let name = &entry.get_ref().name;
            let twice = match seen.iter().find(|(n, _)| n == name.get_ref()) {
                Some((n, line)) => {
                    let reason = format!("export `{n}` is already defined (line {line})");
                    self.fail(&name.span(), format!("nbd.export[{i}].name"), reason);
                    true
                }
                None => {
                    let line = Location::of_span(self.text, &entry.span()).line;
                    seen.push((name.get_ref().clone(), line));
                    false
                }
            };
            let export = self.nbd_export(i, entry, devices);
            if let Some(e) = export.filter(|_| !twice) {
                exports.push(e);
            }
        }
        Some(Nbd {
            listen,
            tls,
            exports,
            at,
        })
    }

    fn nbd_listen(
        &mut self,
        raw: Option<Spanned<Vec<Spanned<String>>>>,
        portals: &[Portal],
    ) -> Vec<export::ListenAddr> {
        let Some(list) = raw else {
            return vec![listen_addr(DEFAULT_NBD_LISTEN).expect("the default parses")];
        };
        if list.get_ref().is_empty() {
            self.fail(
                &list.span(),
                "nbd.listen".into(),
                format!("lists no address; leave `listen` out for {DEFAULT_NBD_LISTEN}"),
            );
        }
        let mut out: Vec<export::ListenAddr> = Vec::new();
        for (j, entry) in list.into_inner().into_iter().enumerate() {
            let field = || format!("nbd.listen[{j}]");
            let Some(addr) = self.check(&entry.span(), field, listen_addr(entry.get_ref())) else {
                continue;
            };
            let taken = match &addr {
                export::ListenAddr::Tcp(a) => portals.iter().any(|p| p.listen == *a),
                export::ListenAddr::Unix(_) => false,
            };
            if taken {
                self.fail(
                    &entry.span(),
                    field(),
                    format!("{addr} is the `listen` of an iSCSI [[portal]]"),
                );
            } else if out.contains(&addr) {
                self.fail(&entry.span(), field(), format!("{addr} is listed twice"));
            } else {
                out.push(addr);
            }
        }
        out
    }

    fn nbd_export(
        &mut self,
        i: usize,
        entry: Spanned<RawNbdExport>,
        devices: &[String],
    ) -> Option<NbdExport> {
        let before = self.issues.len();
        let at = self.at(&entry.span());
        let raw = entry.into_inner();
        let field = |name: &str| format!("nbd.export[{i}].{name}");
        let name = raw.name.get_ref();
        let ok = if name.is_empty() {
            Err(format!(
                "must not be empty (clients asking for \"\" get the export named `{}`)",
                export::DEFAULT_EXPORT
            ))
        } else if name.len() > MAX_STRING {
            Err(format!("an export name has at most {MAX_STRING} bytes"))
        } else if name.chars().any(char::is_control) {
            Err("an export name has no control characters".into())
        } else {
            Ok(())
        };
        self.check(&raw.name.span(), || field("name"), ok);
        let device = raw.device.get_ref();
        if !devices.contains(device) {
            self.fail(
                &raw.device.span(),
                field("device"),
                format!("no [[device]] is named `{device}`"),
            );
        } else {
            let span = raw.device.span();
            self.served(device, "an NBD export", &span, field("device"));
        }
        let mut allow = Vec::new();
        if let Some(list) = &raw.allow {
            for (j, entry) in list.get_ref().iter().enumerate() {
                let rule = entry.get_ref().trim().parse::<export::Rule>();
                let afield = || format!("nbd.export[{i}].allow[{j}]");
                if self.check(&entry.span(), afield, rule).is_some() {
                    allow.push(entry.get_ref().trim().to_string());
                }
            }
        }
        let description = raw.description.as_ref().map_or(String::new(), |d| {
            if d.get_ref().len() > MAX_STRING {
                self.fail(
                    &d.span(),
                    field("description"),
                    format!("a description has at most {MAX_STRING} bytes"),
                );
            }
            d.get_ref().clone()
        });
        if self.issues.len() != before {
            return None;
        }
        Some(NbdExport {
            name: name.clone(),
            device: device.clone(),
            read_only: raw.read_only.unwrap_or(false),
            allow,
            description,
            at,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::parse_config;

    const DEVICES: &str = r#"
[[portal]]
listen = "127.0.0.1:3260"

[[device]]
name = "d0"
kind = "mem"
size = "1M"

[[device]]
name = "flaky"
kind = "faulty"
over = "d0"
"#;

    fn errors(nbd: &str) -> String {
        parse_config(&format!("{DEVICES}{nbd}"), "test.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn exports_parse_with_the_default_listen_and_count_as_served() {
        let text = format!(
            "{DEVICES}\n[nbd]\n[[nbd.export]]\nname = \"vm1\"\ndevice = \"flaky\"\n\
             allow = [\"10.0.0.0/8\", \"unix\"]\ndescription = \"a VM\"\n"
        );
        let c = parse_config(&text, "test.toml").unwrap();
        let nbd = c.nbd.as_ref().unwrap();
        assert_eq!(nbd.listen, [super::listen_addr("127.0.0.1:10809").unwrap()]);
        assert_eq!(nbd.exports[0].allow, ["10.0.0.0/8", "unix"]);
        assert_eq!(nbd.exports[0].at.unwrap().line, 16);
        assert!(c.mapped_devices().contains("flaky"));
        assert!(!c.mapped_devices().contains("d0"));
        let listen = "[nbd]\nlisten = [\"127.0.0.1:10900\", \"unix:/tmp/oa.sock\"]\n";
        let c = parse_config(&format!("{DEVICES}{listen}"), "test.toml").unwrap();
        assert_eq!(c.nbd.unwrap().listen.len(), 2);
    }

    #[test]
    fn bad_exports_name_line_field_and_reason() {
        let e = errors("[nbd]\n[[nbd.export]]\nname = \"vm1\"\ndevice = \"nope\"\n");
        assert!(
            e.contains("test.toml:17")
                && e.contains("nbd.export[0].device: no [[device]] is named `nope`"),
            "{e}"
        );
        let e = errors(
            "[nbd]\n[[nbd.export]]\nname = \"vm1\"\ndevice = \"flaky\"\n\
             [[nbd.export]]\nname = \"vm1\"\ndevice = \"flaky\"\n",
        );
        assert!(
            e.contains("nbd.export[1].name: export `vm1` is already defined (line 15)"),
            "{e}"
        );
        let e = errors(
            "[nbd]\n[[nbd.export]]\nname = \"\"\ndevice = \"flaky\"\nallow = [\"10.0.0.0/40\"]\n",
        );
        assert!(e.contains("nbd.export[0].name: must not be empty"), "{e}");
        assert!(e.contains("nbd.export[0].allow[0]:"), "{e}");
        let e = errors("[nbd]\nlisten = [\"127.0.0.1:3260\", \"unix:\", \"h:x\"]\n");
        assert!(e.contains("nbd.listen[0]: 127.0.0.1:3260 is the `listen` of an iSCSI"));
        assert!(
            e.contains("nbd.listen[1]: unix: needs a socket path"),
            "{e}"
        );
        assert!(e.contains("nbd.listen[2]:"), "{e}");
        let e = errors("[nbd]\nlisten = []\n");
        assert!(e.contains("nbd.listen: lists no address"), "{e}");
        let e = errors("[nbd]\nport = 1\n");
        assert!(e.contains("port"), "{e}");
    }

    #[test]
    fn a_device_under_another_cannot_be_exported() {
        let e = errors("[nbd]\n[[nbd.export]]\nname = \"raw\"\ndevice = \"d0\"\n");
        assert!(
            e.contains("`d0` is under device `flaky` and cannot also be an NBD export"),
            "{e}"
        );
    }
}
