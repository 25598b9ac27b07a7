//! `openarray console`: the address of the running daemon's web console,
//! read from its running configuration's `[daemon] api_listen`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::ExitCode;

use anyhow::{anyhow, bail};
use clap::Args;

use crate::api_client::{call, ApiArgs};

#[derive(Args, Debug)]
pub struct ConsoleArgs {
    #[command(flatten)]
    api: ApiArgs,
}

pub fn run(args: ConsoleArgs) -> ExitCode {
    args.api.run(|endpoint| {
        let (status, answer) = call(endpoint, "GET", "/v1/config", b"", None)?;
        if status != 200 {
            bail!("the daemon answered {status}: {}", answer["error"]);
        }
        let text = answer["toml"]
            .as_str()
            .ok_or_else(|| anyhow!("the daemon's answer has no configuration"))?;
        let config = control::parse_config(text, "the running configuration")?;
        let Some(addr) = config.daemon.api_listen else {
            bail!(
                "the daemon serves no console: it is served on the TCP API, \
                 which [daemon] api_listen and api_token_file turn on (docs/console.md)"
            );
        };
        println!("{}", console_url(addr));
        Ok(ExitCode::SUCCESS)
    })
}

/// The console's URL on `addr`; an address that listens everywhere is
/// reached on this machine through loopback.
fn console_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/console/", SocketAddr::new(ip, addr.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everywhere_is_reached_through_loopback() {
        let url = |a: &str| console_url(a.parse().unwrap());
        assert_eq!(url("0.0.0.0:8470"), "http://127.0.0.1:8470/console/");
        assert_eq!(url("[::]:8470"), "http://[::1]:8470/console/");
        assert_eq!(url("192.0.2.7:80"), "http://192.0.2.7:80/console/");
    }
}
