//! A replay's fold of the log into its projectors, written once for both backends (ADR 0078).
//!
//! Each projector takes part as a [`Step`]: a row projector folds its row changes into an
//! [`Image`] of its tables, written in bulk at the end by the backend; any other projector is
//! applied event by event through the backend ([`ReplayApply`]). An event is decoded once for
//! every row projector, and turned into a recorded event only when a projector applies it.

use std::sync::Arc;

use super::{wants, Decoded, Image, RawRow};
use crate::error::StoreError;
use crate::event::RecordedEvent;
use crate::projector::{EventView, PgProjector, RowChange, RowProjector, SqliteProjector};

/// What a replay needs to know of a projector, whichever backend applies it.
pub(crate) trait Replayable {
    fn name(&self) -> &'static str;
    fn rows(&self) -> Option<&dyn RowProjector>;
    fn aggregate_types(&self) -> Option<&'static [&'static str]>;
}

impl Replayable for dyn SqliteProjector {
    fn name(&self) -> &'static str {
        SqliteProjector::name(self)
    }
    fn rows(&self) -> Option<&dyn RowProjector> {
        SqliteProjector::rows(self)
    }
    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        SqliteProjector::aggregate_types(self)
    }
}

impl Replayable for dyn PgProjector {
    fn name(&self) -> &'static str {
        PgProjector::name(self)
    }
    fn rows(&self) -> Option<&dyn RowProjector> {
        PgProjector::rows(self)
    }
    fn aggregate_types(&self) -> Option<&'static [&'static str]> {
        PgProjector::aggregate_types(self)
    }
}

/// How one projector takes part in a replay.
pub(crate) enum Step<P: ?Sized> {
    /// A row projector: its changes folded into an image of its tables, written at the end
    /// (the buffer of an event's changes is reused from one event to the next).
    Image(Arc<P>, Image, Vec<RowChange>),
    /// Applied event by event.
    Apply(Arc<P>),
}

impl<P: ?Sized + Replayable> Step<P> {
    /// The step of `projector`: an image when it states its changes as rows.
    pub(crate) fn of(projector: &Arc<P>) -> Self {
        match projector.rows() {
            Some(_) => Self::Image(projector.clone(), Image::default(), Vec::new()),
            None => Self::Apply(projector.clone()),
        }
    }

    /// The projector and the image to write, for a row projector's step.
    pub(crate) fn into_image(self) -> Option<(Arc<P>, Image)> {
        match self {
            Self::Image(projector, image, _) => Some((projector, image)),
            Self::Apply(_) => None,
        }
    }
}

/// How a backend applies a projector that is not folded, inside the replay's transaction.
pub(crate) trait ReplayApply {
    /// The backend's projectors.
    type Projector: ?Sized + Replayable;

    async fn apply(
        &mut self,
        projector: &Self::Projector,
        event: &RecordedEvent,
    ) -> Result<(), StoreError>;
}

/// Folds a page of the log into `steps`, event by event in position order.
pub(crate) async fn fold_page<A: ReplayApply>(
    steps: &mut [Step<A::Projector>],
    page: &[RawRow],
    db: &mut A,
) -> Result<(), StoreError> {
    for row in page {
        let event = row.replay();
        let mut decoded = Decoded::default();
        let mut recorded = None;
        for step in steps.iter_mut() {
            match step {
                Step::Image(projector, image, changes) => {
                    let Some(rows) = projector.rows() else {
                        continue;
                    };
                    if !wants(rows.aggregate_types(), event.aggregate_type) {
                        continue;
                    }
                    rows.changes(&EventView::of_replay(&event), &mut decoded, changes)
                        .and_then(|()| image.apply(changes, event.position))
                        .map_err(|e| StoreError::in_projector(projector.name(), e))?;
                }
                Step::Apply(projector) => {
                    if !wants(projector.aggregate_types(), event.aggregate_type) {
                        continue;
                    }
                    if recorded.is_none() {
                        recorded = Some(row.recorded()?);
                    }
                    if let Some(recorded) = &recorded {
                        db.apply(projector, recorded)
                            .await
                            .map_err(|e| StoreError::in_projector(projector.name(), e))?;
                    }
                }
            }
        }
    }
    Ok(())
}
