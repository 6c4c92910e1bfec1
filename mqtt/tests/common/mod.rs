//! Shared test support: unique client ids, options for the local broker, waiting for a delivery
//! with a deadline, and a private Mosquitto on a free loopback port for configs the shared one
//! does not have (ACLs, max_qos) or for stopping a broker under a live connection.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wharf_mqtt::{ConnectOptions, Deliveries, Delivery, DisconnectCause};

/// The port of the shared loopback broker every test may use: `WHARF_TEST_MQTT_URL`
/// (`mqtt://127.0.0.1:1883` by default, as `scripts/services.sh` provides it).
pub fn shared_port() -> u16 {
    let url = std::env::var("WHARF_TEST_MQTT_URL")
        .unwrap_or_else(|_| "mqtt://127.0.0.1:1883".to_string());
    let rest = url.strip_prefix("mqtt://").unwrap_or(&url);
    let (host, port) = rest.rsplit_once(':').unwrap_or((rest, "1883"));
    assert!(
        matches!(host, "127.0.0.1" | "localhost"),
        "WHARF_TEST_MQTT_URL must name a loopback broker, not {url}"
    );
    port.trim_end_matches('/')
        .parse()
        .unwrap_or_else(|_| panic!("WHARF_TEST_MQTT_URL has no valid port: {url}"))
}

/// The mosquitto binary: on PATH, or where Debian installs it.
fn mosquitto_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("mosquitto"))
            .find(|candidate| candidate.is_file())
    });
    on_path.unwrap_or_else(|| PathBuf::from("/usr/sbin/mosquitto"))
}

/// Mosquitto's dynamic security plugin, which (unlike `acl_file`) can refuse a SUBSCRIBE.
pub fn dynamic_security_plugin() -> PathBuf {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so",
        "/usr/lib/aarch64-linux-gnu/mosquitto_dynamic_security.so",
        "/usr/lib/mosquitto_dynamic_security.so",
        "/usr/local/lib/mosquitto_dynamic_security.so",
    ];
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("no mosquitto_dynamic_security.so in {candidates:?}"))
}
/// How long any single wait in a test may take.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A name no other test, run or process uses.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Options for a client of the broker on `port`, with test-sized timeouts.
pub fn options(port: u16, client_id: &str) -> ConnectOptions {
    let mut options = ConnectOptions::new("127.0.0.1", port, client_id);
    options.connect_timeout = DEADLINE;
    options.operation_timeout = DEADLINE;
    options
}

/// The next delivery, failing the test if none comes within the deadline.
pub async fn next_delivery(deliveries: &mut Deliveries) -> Delivery {
    match tokio::time::timeout(DEADLINE, deliveries.next()).await {
        Ok(Ok(delivery)) => delivery,
        Ok(Err(cause)) => panic!("the deliveries ended: {cause}"),
        Err(_) => panic!("no delivery within {DEADLINE:?}"),
    }
}

/// The cause the deliveries end with, failing the test if they do not end within the deadline.
pub async fn end_of(deliveries: &mut Deliveries) -> DisconnectCause {
    let wait = async {
        loop {
            if let Err(cause) = deliveries.next().await {
                return cause;
            }
        }
    };
    tokio::time::timeout(DEADLINE, wait)
        .await
        .expect("the deliveries did not end within the deadline")
}

/// A Mosquitto of our own, killed on drop.
pub struct Broker {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Broker {
    /// Starts `mosquitto -c` with a loopback listener, anonymous access, no persistence, and
    /// `extra` config lines.
    pub fn start(extra: &str) -> Broker {
        Broker::start_with(extra, &[])
    }

    /// Like `start`, with files written into the broker's directory first; `{dir}` in `extra`
    /// names that directory.
    pub fn start_with(extra: &str, files: &[(&str, &str)]) -> Broker {
        let mut dir = tempfile::tempdir().expect("temp dir");
        for _ in 0..5 {
            for (name, content) in files {
                std::fs::write(dir.path().join(name), content).expect("write a broker file");
            }
            let port = free_port();
            let config = format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n{}\n",
                extra.replace("{dir}", &dir.path().display().to_string())
            );
            let path = dir.path().join("mosquitto.conf");
            std::fs::write(&path, config).expect("write mosquitto.conf");
            let log = std::fs::File::create(dir.path().join("mosquitto.log")).expect("log file");
            let child = Command::new(mosquitto_binary())
                .arg("-c")
                .arg(&path)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start mosquitto");
            let mut broker = Broker {
                port,
                child: Some(child),
                dir,
            };
            if broker.wait_listening() {
                return broker;
            }
            // Lost the port to someone else; try another.
            dir = broker.take_dir();
        }
        panic!("mosquitto did not start on any free port");
    }

    /// A file path inside the broker's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Kills the broker (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the broker (SIGSTOP): its sockets stay open and nothing is answered.
    pub fn pause(&self) {
        signal(self.pid(), "-STOP");
    }

    /// Lets a paused broker run again (SIGCONT).
    pub fn resume(&self) {
        signal(self.pid(), "-CONT");
    }

    fn wait_listening(&mut self) -> bool {
        let deadline = Instant::now() + DEADLINE;
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
        self.kill();
        let dir = tempfile::tempdir().expect("temp dir");
        std::mem::replace(&mut self.dir, dir)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn signal(pid: u32, which: &str) {
    let status = Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pid} failed");
}

/// Runs `mosquitto_pub -V 5 -p PORT` with `args` and asserts it succeeded.
pub fn mosquitto_pub(port: u16, args: &[&str]) {
    let output = Command::new("mosquitto_pub")
        .args(["-V", "5", "-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run mosquitto_pub");
    assert!(
        output.status.success(),
        "mosquitto_pub failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Waits until `condition` holds, failing the test past the deadline.
pub async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}
