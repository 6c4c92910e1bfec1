//! CPU time per request, from `/proc` (Linux): this process's (the API, its client and the
//! baseline's driver) and the Postgres server's (every process named `postgres`), so a case
//! says where its time goes under load, not only how long a request waits. Times are in
//! clock ticks of 10 ms (`USER_HZ`, 100 on Linux): a side's few thousand requests make them
//! exact to a few percent. `None` where `/proc` is not readable. On SQLite the store works in
//! this process, so the server's column reads zero.

use std::fs;

/// CPU seconds used so far by this process and by the Postgres server.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuClock {
    own: f64,
    server: f64,
}

/// A process's user and system time, in seconds, from its `stat` line (`comm` may hold
/// spaces, so fields are counted after its closing parenthesis).
fn seconds(stat: &str) -> Option<(String, f64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after `comm` and `state`.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((comm, (utime + stime) / 100.0))
}

impl CpuClock {
    /// Reads both clocks now.
    pub fn read() -> Option<Self> {
        let own = seconds(&fs::read_to_string("/proc/self/stat").ok()?)?.1;
        let mut server = 0.0;
        for entry in fs::read_dir("/proc").ok()?.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some((comm, used)) = seconds(&stat) {
                if comm == "postgres" {
                    server += used;
                }
            }
        }
        Some(Self { own, server })
    }

    /// The time used since `earlier`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            own: self.own - earlier.own,
            server: self.server - earlier.server,
        }
    }

    /// Adds another span.
    pub fn add(&mut self, other: Self) {
        self.own += other.own;
        self.server += other.server;
    }

    /// Milliseconds per request of this process and of the server, over `requests`.
    pub fn per_request(self, requests: usize) -> (f64, f64) {
        let n = requests.max(1) as f64;
        (self.own * 1e3 / n, self.server * 1e3 / n)
    }
}
