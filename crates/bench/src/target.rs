//! Where the server under test is: a base URL given with `--url`, or a
//! `weft serve` child process that the bench starts itself (`--spawn`) on an
//! ephemeral port with a temporary data directory, and stops at the end.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a spawned server may take to print its listening line.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(30);

/// The line prefix a `weft serve` prints on stdout once it accepts requests.
const LISTENING_PREFIX: &str = "weft listening on ";

/// A parsed `http://host[:port][/prefix]` base URL.
///
/// The bench speaks plain HTTP/1.1 itself (see [`crate::http`]), so it only
/// needs the address to connect to, the `Host` header, and a path prefix
/// (for a weft behind a reverse proxy under a sub-path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    /// `host:port`, as given to `TcpStream::connect` (port 80 when absent).
    pub connect: String,
    /// The authority as written in the URL, sent as the `Host` header.
    pub host: String,
    /// Path prefix without a trailing slash ("" for the root).
    pub prefix: String,
}

impl BaseUrl {
    /// Parses an `http://` URL. `https` is refused with a clear message: the
    /// bench measures weft, not a TLS terminator, so point it at the
    /// plain-HTTP listener.
    pub fn parse(url: &str) -> anyhow::Result<BaseUrl> {
        let url = url.trim();
        let rest = if let Some(rest) = url.strip_prefix("http://") {
            rest
        } else if url.starts_with("https://") {
            bail!("{url}: https is not supported by the bench client; point --url at weft's plain-HTTP listener");
        } else {
            bail!("{url}: expected an http:// URL");
        };
        let (authority, path) = match rest.find(['/', '?', '#']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            bail!("{url}: expected http://host[:port][/prefix]");
        }
        if path.contains(['?', '#']) {
            bail!("{url}: a base URL takes no query or fragment");
        }
        // A port is present when there is a ':' after any IPv6 bracket.
        let host_part_end = authority.rfind(']').map_or(0, |i| i + 1);
        let has_port = authority[host_part_end..].contains(':');
        let connect = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        Ok(BaseUrl {
            connect,
            host: authority.to_string(),
            prefix: path.trim_end_matches('/').to_string(),
        })
    }

    /// The request target for an absolute API path (`/api/v1/...`).
    pub fn path(&self, path: &str) -> String {
        format!("{}{}", self.prefix, path)
    }

    /// The `ws://` URL of an API path, for the live websocket (with the
    /// run's API key as `access_token`).
    pub fn ws_url(&self, path: &str) -> String {
        match crate::http::api_key() {
            Some(key) => format!(
                "ws://{}{}{}?access_token={key}",
                self.host, self.prefix, path
            ),
            None => format!("ws://{}{}{}", self.host, self.prefix, path),
        }
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.host, self.prefix)
    }
}

/// A `weft serve` child process started for this run.
///
/// It runs the same executable as the bench (the bench is a subcommand of
/// the `weft` binary), listens on an ephemeral loopback port, and keeps its
/// data in a temporary directory removed when this value is dropped. Its
/// stderr goes to `server.log` in that directory so the bench's own output
/// stays readable; the log's tail is shown if the server fails to start.
pub struct SpawnedServer {
    child: Child,
    /// Held for its `Drop`: removes the data directory.
    dir: tempfile::TempDir,
}

impl SpawnedServer {
    /// Starts `weft serve` and waits for its `weft listening on <url>` line.
    pub async fn start(ingest_key: Option<&str>) -> anyhow::Result<(SpawnedServer, BaseUrl)> {
        let exe = std::env::current_exe().context("locating the weft executable")?;
        let dir = tempfile::Builder::new()
            .prefix("weft-bench-")
            .tempdir()
            .context("creating a temporary data directory")?;
        let data = dir.path().join("data");
        let log_path = dir.path().join("server.log");
        let log = std::fs::File::create(&log_path).context("creating server.log")?;
        let mut cmd = Command::new(&exe);
        cmd.arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data")
            .arg(&data);
        if let Some(key) = ingest_key {
            cmd.arg("--ingest-key").arg(key);
        }
        // An admin key for the run (unless one is given), and a rate
        // limit no load reaches: the bench measures weft's work per
        // request, key check and bucket included, not the limit itself.
        // With WEFT_AUTH=off in the environment the server ignores them.
        let admin_key = std::env::var("WEFT_ADMIN_KEY")
            .unwrap_or_else(|_| format!("weft_bench_{}", uuid::Uuid::new_v4().simple()));
        cmd.env("WEFT_ADMIN_KEY", &admin_key);
        for (var, value) in [
            ("WEFT_HTTP__RATE_LIMIT", "1000000000"),
            ("WEFT_HTTP__RATE_BURST", "1000000000"),
        ] {
            if std::env::var_os(var).is_none() {
                cmd.env(var, value);
            }
        }
        crate::http::use_api_key(admin_key);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {} serve", exe.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let found = tokio::time::timeout(SPAWN_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = line.trim().strip_prefix(LISTENING_PREFIX) {
                    return Ok::<_, std::io::Error>(Some(url.trim().to_string()));
                }
            }
            Ok(None)
        })
        .await;
        let url = match found {
            Ok(Ok(Some(url))) => url,
            Ok(Ok(None)) | Ok(Err(_)) => {
                let status = child.wait().await.ok();
                bail!(
                    "the spawned server exited before listening ({}){}",
                    status.map_or_else(|| "unknown status".to_string(), |s| s.to_string()),
                    log_tail(&log_path)
                );
            }
            Err(_) => bail!(
                "the spawned server printed no '{LISTENING_PREFIX}…' line within {}s{}",
                SPAWN_TIMEOUT.as_secs(),
                log_tail(&log_path)
            ),
        };
        // Keep reading stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let base = BaseUrl::parse(&url)
            .map_err(|e| anyhow!("the spawned server announced {url:?}: {e}"))?;
        Ok((SpawnedServer { child, dir }, base))
    }

    /// The server's process id (`None` once it has exited).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills the server and waits for it to exit (its data is throw-away).
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        drop(self.dir);
    }
}

/// The last lines of the server log, formatted to follow an error message.
fn log_tail(path: &std::path::Path) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = &lines[lines.len().saturating_sub(20)..];
    format!("\nlast lines of the server's log:\n{}", tail.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_port_and_prefix() {
        let u = BaseUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(u.connect, "127.0.0.1:8080");
        assert_eq!(u.host, "127.0.0.1:8080");
        assert_eq!(u.prefix, "");
        assert_eq!(u.path("/health"), "/health");
        assert_eq!(u.ws_url("/api/v1/live"), "ws://127.0.0.1:8080/api/v1/live");

        let u = BaseUrl::parse("http://localhost/weft/").unwrap();
        assert_eq!(u.connect, "localhost:80");
        assert_eq!(u.prefix, "/weft");
        assert_eq!(u.path("/health"), "/weft/health");
        assert_eq!(u.to_string(), "http://localhost/weft");

        let u = BaseUrl::parse("http://[::1]:9000/").unwrap();
        assert_eq!(u.connect, "[::1]:9000");
        let u = BaseUrl::parse("http://[::1]").unwrap();
        assert_eq!(u.connect, "[::1]:80");
    }

    #[test]
    fn refuses_what_it_cannot_speak() {
        assert!(BaseUrl::parse("https://x").is_err());
        assert!(BaseUrl::parse("127.0.0.1:8080").is_err());
        assert!(BaseUrl::parse("http://").is_err());
        assert!(BaseUrl::parse("http://h/p?q=1").is_err());
    }
}
