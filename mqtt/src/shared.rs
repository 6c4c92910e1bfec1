//! The state one connection's tasks and handles share: outstanding packet ids and the requests
//! waiting on them, the incoming QoS 1/2 deliveries not yet acked, the ping in flight, and the
//! cause once the connection has ended. Every map is per connection, so an acknowledgement is
//! matched by (generation, packet id) and nothing outlives its connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, SubscribeReasonCode, UnsubAckReason};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::delivery::Generation;
use crate::error::DisconnectCause;
use crate::pkid::PacketIds;

/// What a request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Subscribe,
    Unsubscribe,
    Publish,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Subscribe => "SUBSCRIBE",
            Kind::Unsubscribe => "UNSUBSCRIBE",
            Kind::Publish => "PUBLISH",
        }
    }
}

/// The acknowledgement a request gets.
#[derive(Debug)]
pub(crate) enum Reply {
    Subscribed(Vec<SubscribeReasonCode>),
    Unsubscribed(Vec<UnsubAckReason>),
    Published(PubAckReason),
}

/// A request sent and not yet acknowledged. It holds its packet id and one receive-maximum
/// permit until its acknowledgement arrives or the connection ends, even if its caller timed out.
struct Pending {
    kind: Kind,
    reply: oneshot::Sender<Reply>,
    _permit: OwnedSemaphorePermit,
}

/// What the writer task sends.
pub(crate) enum Outbound {
    Packet(Box<Packet>),
    /// A DISCONNECT: written, flushed, then the connection ends; the sender learns it was written.
    Disconnect([u8; 4], DisconnectCause, oneshot::Sender<()>),
}

/// Receipt numbers are unique in the process, not only per connection, so a receipt can never
/// match on another connection even if the generation check were bypassed.
static NEXT_RECEIPT: AtomicU64 = AtomicU64::new(1);

#[derive(Default)]
struct Incoming {
    /// pkid -> the receipt number of the delivery in flight with it.
    in_flight: HashMap<u16, u64>,
}

struct State {
    ids: PacketIds,
    pending: HashMap<u16, Pending>,
    incoming: Incoming,
    ping_sent: Option<Instant>,
    last_read: Instant,
    cause: Option<DisconnectCause>,
}

/// The broker's limits from CONNACK.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) broker_max_packet: Option<u32>,
    pub(crate) keep_alive: Duration,
    pub(crate) operation_timeout: Duration,
    pub(crate) max_packet_size: u32,
}

pub(crate) struct Shared {
    pub(crate) generation: Generation,
    pub(crate) limits: Limits,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) outbound: mpsc::Sender<Outbound>,
    closed: watch::Sender<Option<DisconnectCause>>,
    state: Mutex<State>,
    releases: AtomicU64,
}

/// Why an acknowledgement could not be matched; it ends the connection.
pub(crate) struct Unmatched(pub(crate) String);

impl Shared {
    pub(crate) fn new(
        generation: Generation,
        limits: Limits,
        receive_maximum: u16,
        outbound: mpsc::Sender<Outbound>,
    ) -> Shared {
        Shared {
            generation,
            limits,
            permits: Arc::new(Semaphore::new(usize::from(receive_maximum.max(1)))),
            outbound,
            closed: watch::Sender::new(None),
            state: Mutex::new(State {
                ids: PacketIds::new(),
                pending: HashMap::new(),
                incoming: Incoming::default(),
                ping_sent: None,
                last_read: Instant::now(),
                cause: None,
            }),
            releases: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves maps that are still consistent per entry.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn watch_closed(&self) -> watch::Receiver<Option<DisconnectCause>> {
        self.closed.subscribe()
    }

    /// The cause, once the connection has ended.
    pub(crate) fn cause(&self) -> Option<DisconnectCause> {
        self.lock().cause.clone()
    }

    /// Ends the connection once: the first cause wins; every waiting request fails, every
    /// unacked delivery becomes stale, and both tasks stop.
    pub(crate) fn close(&self, cause: DisconnectCause) {
        let mut state = self.lock();
        if state.cause.is_some() {
            return;
        }
        state.cause = Some(cause.clone());
        state.pending.clear();
        state.incoming.in_flight.clear();
        drop(state);
        self.permits.close();
        self.closed.send_replace(Some(cause));
    }

    /// Takes a free packet id for a request holding `permit`, and registers its waiter.
    pub(crate) fn register(
        &self,
        kind: Kind,
        permit: OwnedSemaphorePermit,
    ) -> Result<(u16, oneshot::Receiver<Reply>), DisconnectCause> {
        let mut state = self.lock();
        if let Some(cause) = &state.cause {
            return Err(cause.clone());
        }
        // The permits never exceed 65535, so a free id always exists here.
        let Some(pkid) = state.ids.allocate() else {
            return Err(DisconnectCause::Protocol(
                "all 65535 packet identifiers are outstanding".to_string(),
            ));
        };
        let (reply, receiver) = oneshot::channel();
        state.pending.insert(
            pkid,
            Pending {
                kind,
                reply,
                _permit: permit,
            },
        );
        Ok((pkid, receiver))
    }

    /// Hands an acknowledgement to the request that sent `pkid` on this connection.
    pub(crate) fn complete(&self, pkid: u16, kind: Kind, reply: Reply) -> Result<(), Unmatched> {
        let mut state = self.lock();
        match state.pending.get(&pkid).map(|pending| pending.kind) {
            Some(found) if found == kind => {}
            Some(found) => {
                return Err(Unmatched(format!(
                    "an acknowledgement for {} with packet id {pkid}, which is a {}",
                    kind.name(),
                    found.name()
                )))
            }
            None => {
                return Err(Unmatched(format!(
                    "an acknowledgement for {} with packet id {pkid}, which is not outstanding",
                    kind.name()
                )))
            }
        }
        let Some(pending) = state.pending.remove(&pkid) else {
            return Ok(());
        };
        state.ids.release(pkid);
        drop(state);
        // The caller may have timed out and gone; the id is free again either way.
        let _ = pending.reply.send(reply);
        Ok(())
    }

    /// Records an incoming QoS 1/2 PUBLISH; returns its receipt number. A second PUBLISH with
    /// the same id replaces the first: only the newest receipt can be acked.
    pub(crate) fn receive(&self, pkid: u16) -> u64 {
        let receipt = NEXT_RECEIPT.fetch_add(1, Ordering::Relaxed);
        self.lock().incoming.in_flight.insert(pkid, receipt);
        receipt
    }

    /// Whether this connection may ack `receipt`: true once, while it is the receipt in flight.
    pub(crate) fn take_receipt(&self, pkid: u16, receipt: u64) -> Result<(), TakeFailure> {
        let mut state = self.lock();
        if state.cause.is_some() {
            return Err(TakeFailure::Ended);
        }
        match state.incoming.in_flight.get(&pkid) {
            Some(&current) if current == receipt => {
                state.incoming.in_flight.remove(&pkid);
                Ok(())
            }
            _ => Err(TakeFailure::NotInFlight),
        }
    }

    /// Requests sent and not yet acknowledged (each holds a packet id).
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().pending.len()
    }

    /// Counts a PUBREL answered with PUBCOMP.
    pub(crate) fn count_release(&self) {
        self.releases.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn releases(&self) -> u64 {
        self.releases.load(Ordering::Relaxed)
    }

    pub(crate) fn ping_sent(&self) -> Option<Instant> {
        self.lock().ping_sent
    }

    /// Bytes arrived from the broker.
    pub(crate) fn mark_read(&self) {
        self.lock().last_read = Instant::now();
    }

    pub(crate) fn last_read(&self) -> Instant {
        self.lock().last_read
    }

    pub(crate) fn set_ping_sent(&self, at: Option<Instant>) {
        self.lock().ping_sent = at;
    }
}

/// Why an ack was not sent.
pub(crate) enum TakeFailure {
    Ended,
    NotInFlight,
}
