//! A private Mosquitto for the ingest tests: a loopback port of its own, persistence into its
//! own temp dir (so a restart keeps every persistent session, its subscriptions and its queue),
//! and a log file with `log_type all`, so a test can prove which client IDs ever connected.
//! A small copy of what the driver's tests use (`mqtt/tests/common`), with restarts.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Mosquitto of our own, killed on drop.
pub struct Broker {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

fn mosquitto_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("mosquitto"))
            .find(|candidate| candidate.is_file())
    });
    on_path.unwrap_or_else(|| PathBuf::from("/usr/sbin/mosquitto"))
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl Broker {
    /// Starts a persistent broker on a free loopback port.
    pub fn start() -> Broker {
        let mut dir = tempfile::tempdir().unwrap();
        for _ in 0..5 {
            let mut broker = Broker {
                port: free_port(),
                child: None,
                dir,
            };
            if broker.spawn() {
                return broker;
            }
            dir = broker.take_dir();
        }
        panic!("mosquitto did not start on any free port");
    }

    fn config(&self) -> String {
        let dir = self.dir.path().display();
        // `user root` keeps a broker started by root writing into root's temp dir (it has no
        // effect for other users). No cap on an offline session's queue: the tests count
        // every message.
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\nuser root\n\
             persistence true\npersistence_location {dir}/\n\
             log_dest file {dir}/mosquitto.log\nlog_type all\n\
             max_queued_messages 0\nmax_queued_bytes 0\n",
            port = self.port
        )
    }

    fn spawn(&mut self) -> bool {
        let path = self.dir.path().join("mosquitto.conf");
        std::fs::write(&path, self.config()).unwrap();
        let child = Command::new(mosquitto_binary())
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto");
        self.child = Some(child);
        self.wait_listening()
    }

    /// Stops the broker gracefully (SIGTERM: it writes its persistence file) and starts it again
    /// on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        assert!(
            self.spawn(),
            "mosquitto did not come back on port {}",
            self.port
        );
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    /// The broker's log so far (flushed per line by Mosquitto).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// Whether a client with exactly this ID ever connected (`... as ID (p5, ...`).
    pub fn saw_connect_from(&self, client_id: &str) -> bool {
        self.log().contains(&format!(" as {client_id} ("))
    }

    /// The broker URL for a Wharf config.
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    fn wait_listening(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    self.child = None;
                    return false;
                }
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn take_dir(mut self) -> tempfile::TempDir {
        self.stop();
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
