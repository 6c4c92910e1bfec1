//! A TCP proxy in front of Postgres, for tests that cut a store off and bring it back.
//!
//! It listens on a free port of 127.0.0.1 and relays every connection to the upstream address.
//! [`TcpProxy::stop`] closes the listener and every live connection (so the clients see their
//! connections die and new ones refused, as in an outage); [`TcpProxy::restart`] listens on the
//! same port again.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::pg_url;

/// A stoppable TCP relay.
pub struct TcpProxy {
    listen: SocketAddr,
    upstream: SocketAddr,
    running: Mutex<Option<Running>>,
}

struct Running {
    accept: JoinHandle<()>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl TcpProxy {
    /// Starts relaying a free port of 127.0.0.1 to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a free port for the proxy");
        let listen = listener.local_addr().expect("the proxy's address");
        let proxy = Self {
            listen,
            upstream,
            running: Mutex::new(None),
        };
        proxy.serve(listener);
        proxy
    }

    /// Starts relaying to the test Postgres (`pg_url()`).
    pub async fn to_test_postgres() -> Self {
        let (_, authority, _) = split_pg_url(&pg_url());
        let upstream = tokio::net::lookup_host(authority)
            .await
            .expect("resolving the test Postgres")
            .next()
            .expect("the test Postgres has an address");
        Self::start(upstream).await
    }

    /// `url` (a Postgres URL) with its host and port replaced by this proxy's.
    pub fn pg_url_through(&self, url: &str) -> String {
        let (scheme_and_user, _, rest) = split_pg_url(url);
        format!("{scheme_and_user}{}{rest}", self.listen)
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Closes the listener and every live connection; returns once they are closed.
    pub async fn stop(&self) {
        let running = self.running.lock().expect("proxy state").take();
        let Some(running) = running else {
            return;
        };
        running.accept.abort();
        let _ = running.accept.await;
        let connections = std::mem::take(&mut *running.connections.lock().expect("connections"));
        for connection in &connections {
            connection.abort();
        }
        for connection in connections {
            let _ = connection.await;
        }
    }

    /// Listens on the same port again after [`TcpProxy::stop`].
    pub async fn restart(&self) {
        if self.running.lock().expect("proxy state").is_some() {
            return;
        }
        let listener = TcpListener::bind(self.listen)
            .await
            .expect("re-binding the proxy's port");
        self.serve(listener);
    }

    fn serve(&self, listener: TcpListener) {
        let connections = Arc::new(Mutex::new(Vec::<JoinHandle<()>>::new()));
        let (upstream, tracked) = (self.upstream, connections.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let relay = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                let mut tracked = tracked.lock().expect("connections");
                tracked.retain(|c| !c.is_finished());
                tracked.push(relay);
            }
        });
        *self.running.lock().expect("proxy state") = Some(Running {
            accept,
            connections,
        });
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(running) = self.running.lock().map(|mut r| r.take()).ok().flatten() {
            running.accept.abort();
            for connection in running.connections.lock().expect("connections").iter() {
                connection.abort();
            }
        }
    }
}

/// Splits `postgres://user@host:port/db?x` into (`postgres://user@`, `host:port`, `/db?x`);
/// the port defaults to 5432.
fn split_pg_url(url: &str) -> (String, String, String) {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    };
    (format!("{scheme}://{user}"), host, tail.to_owned())
}

#[cfg(test)]
mod tests {
    use super::split_pg_url;

    #[test]
    fn a_pg_url_splits_around_its_host_and_port() {
        assert_eq!(
            split_pg_url("postgres://postgres@127.0.0.1:5432/test"),
            (
                "postgres://postgres@".to_owned(),
                "127.0.0.1:5432".to_owned(),
                "/test".to_owned()
            )
        );
        assert_eq!(
            split_pg_url("postgresql://db/x?sslmode=disable").1,
            "db:5432"
        );
    }
}
