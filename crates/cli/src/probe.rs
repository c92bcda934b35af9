//! `kvgate probe URL`: one HTTP GET, exit 0 on a 2xx answer and 1 otherwise. It is the
//! container image's HEALTHCHECK: the runtime image has no shell and no curl, so the binary
//! checks its own listener. Plain HTTP/1.1 over `std::net` (`http://` only, the probe runs next
//! to the listener it checks): no async runtime, no TLS stack, nothing to start for a check
//! that runs every few seconds.

use anyhow::{bail, Context};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Flags of `kvgate probe`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The URL to GET, `http://HOST[:PORT][/PATH]` (e.g. `http://127.0.0.1:8080/ready`).
    url: String,
    /// Seconds each step (connect, send, read) may take.
    #[arg(long, default_value_t = 3.0)]
    timeout_secs: f64,
}

/// Most of a response the probe reads: the status line, headers and a short body to quote.
const MAX_RESPONSE: u64 = 8 * 1024;

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.timeout_secs.is_finite() && args.timeout_secs > 0.0,
        "--timeout-secs must be positive"
    );
    let timeout = Duration::from_secs_f64(args.timeout_secs);
    let (status, reason, body) =
        get(&args.url, timeout).with_context(|| format!("probe {}", args.url))?;
    if (200..300).contains(&status) {
        println!("{} {status} {reason}", args.url);
        return Ok(());
    }
    let body = body.trim();
    let quoted = if body.is_empty() {
        String::new()
    } else {
        format!(": {}", body.chars().take(200).collect::<String>())
    };
    bail!("probe {}: {status} {reason}{quoted}", args.url)
}

/// `http://host[:port]/path` as (host for the Host header, host:port to connect to, path).
fn split_url(url: &str) -> anyhow::Result<(&str, String, &str)> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("only http:// URLs are probed (the probe checks a listener next to it)");
    };
    let (authority, path) = rest.find('/').map_or((rest, "/"), |i| rest.split_at(i));
    if authority.is_empty() {
        bail!("no host in the URL");
    }
    // A port after the last colon, unless that colon is inside an IPv6 literal's brackets.
    let has_port = authority
        .rfind(':')
        .is_some_and(|i| !authority[i..].contains(']'));
    let target = if has_port {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, target, path))
}

/// GETs `url` and returns its status code, reason phrase and (unless chunked) body text.
fn get(url: &str, timeout: Duration) -> anyhow::Result<(u16, String, String)> {
    let (host, target, path) = split_url(url)?;
    let addrs: Vec<_> = target
        .to_socket_addrs()
        .with_context(|| format!("resolving {target}"))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(mut stream) = stream else {
        let why = last.map_or_else(|| "no address".to_owned(), |e| e.to_string());
        bail!("cannot connect to {target}: {why}");
    };
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: kvgate-probe\r\nAccept: */*\r\n\
         Connection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .context("sending the request")?;
    let mut response = Vec::new();
    let read = stream.take(MAX_RESPONSE).read_to_end(&mut response);
    // A server may close without reading everything; what arrived before the error counts.
    if response.is_empty() {
        read.context("reading the response")?;
        bail!("the connection closed before a response");
    }
    parse_response(&response)
}

/// Status code, reason and body of a (possibly truncated) HTTP/1.x response.
fn parse_response(response: &[u8]) -> anyhow::Result<(u16, String, String)> {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status_line = head.lines().next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().and_then(|c| c.parse::<u16>().ok());
    let (true, Some(code)) = (version.starts_with("HTTP/1."), code) else {
        bail!(
            "not an HTTP/1 response: {:?}",
            status_line.chars().take(80).collect::<String>()
        );
    };
    let reason = parts.next().unwrap_or_default().trim().to_owned();
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
        })
    });
    let body = if chunked { "" } else { body };
    Ok((code, reason, body.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_host_target_and_path() {
        let s = |u| split_url(u).unwrap();
        assert_eq!(
            s("http://127.0.0.1:8080/ready"),
            ("127.0.0.1:8080", "127.0.0.1:8080".into(), "/ready")
        );
        assert_eq!(
            s("http://localhost"),
            ("localhost", "localhost:80".into(), "/")
        );
        assert_eq!(
            s("http://[::1]/health"),
            ("[::1]", "[::1]:80".into(), "/health")
        );
        assert_eq!(
            s("http://[::1]:9/x?y=1"),
            ("[::1]:9", "[::1]:9".into(), "/x?y=1")
        );
        assert!(split_url("https://127.0.0.1/").is_err());
        assert!(split_url("http:///ready").is_err());
    }

    #[test]
    fn responses_give_status_reason_and_unchunked_body() {
        let r =
            parse_response(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 5\r\n\r\nnope!");
        assert_eq!(
            r.unwrap(),
            (503, "Service Unavailable".into(), "nope!".into())
        );
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        );
        assert_eq!(r.unwrap(), (200, "OK".into(), String::new()));
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n").is_err());
    }
}
