//! A private Mosquitto for tests that need a broker config the shared one does not have: the
//! dynamic security plugin (the only way Mosquitto 2.0.11 refuses a SUBSCRIBE or an
//! UNSUBSCRIBE), `max_qos`, persistence across a restart, or a broker that stops under a live
//! connection. `mosquitto -c FILE` listens on a free loopback port; the broker is killed on drop.
//!
//! [`BrokerConfig`] says what to run; [`Broker::stop`] and [`Broker::restart`] (optionally with a
//! new config) keep the port, the directory and, with persistence, the broker's sessions.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the broker may take to listen.
const STARTUP: Duration = Duration::from_secs(10);

/// What a private broker runs with.
#[derive(Debug, Clone, Default)]
pub struct BrokerConfig {
    /// The dynamic security plugin's JSON config (`dynamic-security.json`), when wanted.
    pub dynsec: Option<String>,
    /// `max_qos`, when set.
    pub max_qos: Option<u8>,
    /// Keep sessions and in-flight messages across a restart (`persistence true` in the
    /// broker's directory).
    pub persistence: bool,
    /// More config lines; `{dir}` names the broker's directory.
    pub extra: String,
}

impl BrokerConfig {
    /// A broker with the dynamic security plugin configured by `json`.
    pub fn dynsec(json: impl Into<String>) -> Self {
        Self {
            dynsec: Some(json.into()),
            ..Self::default()
        }
    }

    /// The same with persistence on.
    pub fn persistent(mut self) -> Self {
        self.persistence = true;
        self
    }

    /// The same with `max_qos`.
    pub fn with_max_qos(mut self, qos: u8) -> Self {
        self.max_qos = Some(qos);
        self
    }

    fn render(&self, port: u16, dir: &Path) -> String {
        let dir_text = dir.display().to_string();
        let mut text = format!("listener {port} 127.0.0.1\nallow_anonymous true\n");
        if self.persistence {
            text.push_str(&format!(
                "persistence true\npersistence_location {dir_text}/\nautosave_interval 1\n"
            ));
        } else {
            text.push_str("persistence false\n");
        }
        if let Some(qos) = self.max_qos {
            text.push_str(&format!("max_qos {qos}\n"));
        }
        if self.dynsec.is_some() {
            text.push_str(&format!(
                "plugin {}\nplugin_opt_config_file {dir_text}/dynamic-security.json\n",
                dynamic_security_plugin().display()
            ));
        }
        text.push_str(&self.extra.replace("{dir}", &dir_text));
        text.push('\n');
        text
    }
}

/// A Mosquitto of our own, killed on drop.
pub struct Broker {
    /// The loopback port it listens on (kept across restarts).
    pub port: u16,
    config: BrokerConfig,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Broker {
    /// Starts a broker with `config` on a free loopback port.
    pub fn start(config: BrokerConfig) -> Broker {
        let dir = tempfile::tempdir().expect("a temp dir for the broker");
        // Started as root, mosquitto runs as the `mosquitto` user: it must be able to write its
        // persistence file (and the dynsec plugin its config) into the directory.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("open the broker's directory to the broker's user");
        let mut broker = Broker {
            port: 0,
            config,
            child: None,
            dir,
        };
        for _ in 0..5 {
            broker.port = free_port();
            if broker.launch() {
                return broker;
            }
            // Lost the port to someone else between probing and binding: try another.
        }
        panic!(
            "mosquitto did not start on any free port; see {}",
            broker.log_path().display()
        );
    }

    /// The broker URL (`mqtt://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// A file path inside the broker's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The broker's log so far (stderr and `log_dest stderr`), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Stops the broker (SIGTERM, so a persistent broker saves its sessions) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + STARTUP;
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the broker (SIGKILL): nothing is saved.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the broker and starts it again on the same port with the same config.
    pub fn restart(&mut self) {
        self.stop();
        self.relaunch();
    }

    /// Stops the broker and starts it again on the same port with `config` (a persistent
    /// broker keeps its sessions when `config` is persistent too).
    pub fn restart_with(&mut self, config: BrokerConfig) {
        self.stop();
        self.config = config;
        self.relaunch();
    }

    fn relaunch(&mut self) {
        // The port was ours a moment ago; a few tries cover a slow socket release.
        for _ in 0..5 {
            if self.launch() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "mosquitto did not restart on port {}: {}",
            self.port,
            self.log()
        );
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("mosquitto.log")
    }

    /// Writes the config files and starts mosquitto; true once it listens.
    fn launch(&mut self) -> bool {
        let dir = self.dir.path().to_path_buf();
        if let Some(json) = &self.config.dynsec {
            std::fs::write(dir.join("dynamic-security.json"), json).expect("write dynsec json");
        }
        let path = dir.join("mosquitto.conf");
        std::fs::write(&path, self.config.render(self.port, &dir)).expect("write mosquitto.conf");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("the broker's log file");
        let child = Command::new(mosquitto_binary())
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start mosquitto");
        self.child = Some(child);
        self.wait_listening()
    }

    fn wait_listening(&mut self) -> bool {
        let deadline = Instant::now() + STARTUP;
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
        self.kill();
        false
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The mosquitto binary: on PATH, or where Debian installs it.
pub fn mosquitto_binary() -> PathBuf {
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

/// A dynamic-security config for anonymous clients: everything may be published and received
/// and unsubscribed unless a rule says otherwise; a SUBSCRIBE is allowed only by an
/// `allow: true` rule. `rules` are `(acltype, topic, allow)`, e.g.
/// `("subscribePattern", "plant/#", true)` or `("unsubscribePattern", "legacy/#", false)`.
pub fn anonymous_dynsec(rules: &[(&str, &str, bool)]) -> String {
    let acls: Vec<String> = rules
        .iter()
        .map(|(acltype, topic, allow)| {
            format!(
                "{{\"acltype\": \"{acltype}\", \"topic\": \"{topic}\", \"priority\": 0, \
                 \"allow\": {allow}}}"
            )
        })
        .collect();
    format!(
        r#"{{
  "defaultACLAccess": {{"publishClientSend": true, "publishClientReceive": true,
                       "subscribe": false, "unsubscribe": true}},
  "clients": [],
  "groups": [{{"groupname": "anonymous", "roles": [{{"rolename": "tests"}}], "clients": []}}],
  "roles": [{{"rolename": "tests", "acls": [{}]}}],
  "anonymousGroup": "anonymous"
}}"#,
        acls.join(", ")
    )
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}
