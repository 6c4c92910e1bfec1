//! A private Mosquitto for the MQTT benchmarks (loopback, a free port, no persistence, no cap
//! on an offline session's queue), so other processes' traffic on the shared broker does not
//! enter the figures. Both sides of every comparison use it. Killed on drop.
//! `WHARF_BENCH_MQTT_INFLIGHT` sets its `max_inflight_messages` (Mosquitto's default: 20).
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Broker {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Broker {
    pub fn start() -> Broker {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let path = dir.path().join("mosquitto.conf");
        let inflight = std::env::var("WHARF_BENCH_MQTT_INFLIGHT")
            .map(|n| format!("max_inflight_messages {n}\n"))
            .unwrap_or_default();
        std::fs::write(
            &path,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
                 max_queued_messages 0\nmax_queued_bytes 0\n{inflight}"
            ),
        )
        .expect("write mosquitto.conf");
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto on PATH (Debian: /usr/sbin)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "mosquitto did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Broker {
            port,
            child,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
