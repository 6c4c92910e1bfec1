//! A run's deliveries: taking what the driver has waiting into the machine's inputs, and
//! handing what the machine dispatched to the handler in bounded commits, acked after each.

use futures::FutureExt;
use wharf_domain::session::Input;
use wharf_mqtt::Delivery;

use super::{Connection, Run, Step};
use crate::ingest::{to_log_message, MqttMessage};

impl Run<'_> {
    /// Takes a delivery and whatever else is already waiting, up to a batch: `ingest_batch`
    /// deliveries, and no more once their payloads reach `ingest_batch_bytes`.
    pub(super) fn receive(&mut self, first: Delivery, connection: &mut Connection) {
        let mut bytes = first.payload.len();
        self.park(first);
        while !self.settings.ingest_batch_full(self.parked.len(), bytes) {
            // Outside the task's cooperative budget: a budget spent by the loop would make a
            // ready delivery look pending and cut the batch short (64 of 100 seen under load).
            match tokio::task::unconstrained(connection.deliveries.next()).now_or_never() {
                Some(Ok(delivery)) => {
                    bytes += delivery.payload.len();
                    self.park(delivery);
                }
                _ => break,
            }
        }
    }

    fn park(&mut self, delivery: Delivery) {
        self.next_id += 1;
        self.inputs.push_back(Input::Delivery {
            id: self.next_id,
            generation: delivery.generation.0,
            topic: delivery.topic.clone(),
            dup: delivery.dup,
            subscription_ids: delivery.properties.subscription_identifiers.clone(),
        });
        self.parked.insert(self.next_id, delivery);
    }

    /// Hands the dispatched deliveries to the handler in commits of at most `ingest_batch`
    /// deliveries and `ingest_batch_bytes` of payload (deliveries that waited for the
    /// SUBACK dispatch together), acking each commit's deliveries after it.
    pub(super) async fn flush(&mut self, connection: &Connection) -> Step {
        while !self.batch.is_empty() {
            let take = self.next_commit_len();
            let batch: Vec<_> = self.batch.drain(..take).collect();
            if let Step::End(outcome) = self.commit(batch, connection).await {
                return Step::End(outcome);
            }
        }
        Step::Continue
    }

    /// How many of the dispatched deliveries the next commit takes (at least one).
    fn next_commit_len(&self) -> usize {
        let mut bytes = 0;
        let mut take = 0;
        for (_, delivery) in &self.batch {
            if take > 0 && self.settings.ingest_batch_full(take, bytes) {
                break;
            }
            bytes += delivery.payload.len();
            take += 1;
        }
        take
    }

    async fn commit(&mut self, batch: Vec<(u64, Delivery)>, connection: &Connection) -> Step {
        let mut messages = Vec::with_capacity(batch.len());
        for (_, delivery) in &batch {
            let Some(log_topic) = self.log_topic(&delivery.topic) else {
                continue;
            };
            match to_log_message(delivery) {
                Ok(message) => messages.push(MqttMessage { log_topic, message }),
                Err(e) => {
                    return Step::End(self.retry(format!(
                        "a delivery on {} cannot be stored in the log ({e}); it stays unacked",
                        delivery.topic
                    )))
                }
            }
        }
        if let Err(e) = self.handler.handle(&messages).await {
            return Step::End(self.retry(format!(
                "the handler failed ({e}); {} deliveries stay unacked for the broker to replay",
                batch.len() + self.batch.len()
            )));
        }
        for (_, delivery) in &batch {
            connection.handle.ack(delivery).await;
        }
        let count = batch.len() as u64;
        self.status.send_modify(|s| s.ingested += count);
        Step::Continue
    }

    /// The log topic of the first desired subscription whose filter matches `topic`.
    fn log_topic(&self, topic: &str) -> Option<wharf_domain::TopicName> {
        self.session
            .subscriptions
            .iter()
            .find(|(filter, _, _)| filter.matches(topic))
            .map(|(_, _, log_topic)| log_topic.clone())
    }
}
