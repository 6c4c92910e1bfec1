//! The install fence: which install of its group a claiming instance joined.
//!
//! An instance declares a binding set and joins the group under the install in effect then
//! (the ledger position of that `Installed` event). A fenced fetch or routing step claims and
//! routes only while that install is still the group's; once a swap has moved the group on,
//! it fails with [`QueueError::Fenced`] and the instance declares again (an instance only
//! handles messages of the set it declared). The check is made once, here, by both backends.

use crate::error::QueueError;

/// The install a claiming instance joined: the ledger position of its `Installed` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InstallFence(i64);

impl InstallFence {
    /// The fence of an instance that joined under the install at ledger position `install`.
    pub fn joined(install: i64) -> Self {
        Self(install)
    }

    /// The ledger position of the install joined.
    pub fn install(self) -> i64 {
        self.0
    }

    /// Whether `install` is the one joined.
    pub(crate) fn admits(self, install: i64) -> bool {
        self.0 == install
    }
}

/// Checks `fence` (when the caller holds one) against the group's install in effect now
/// (`None`: the group has no declaration any more): `Fenced` when they differ.
pub(crate) fn check(
    group: &str,
    fence: Option<InstallFence>,
    current: Option<i64>,
) -> Result<(), QueueError> {
    match fence {
        Some(joined) if current != Some(joined.0) => Err(QueueError::Fenced {
            group: group.to_owned(),
            joined: joined.0,
            current,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unfenced_caller_passes_whatever_the_install() {
        assert!(check("g", None, None).is_ok());
        assert!(check("g", None, Some(7)).is_ok());
    }

    #[test]
    fn a_fence_passes_only_its_own_install() {
        let fence = Some(InstallFence::joined(7));
        assert!(check("g", fence, Some(7)).is_ok());
        match check("g", fence, Some(9)) {
            Err(QueueError::Fenced {
                group,
                joined: 7,
                current: Some(9),
            }) => assert_eq!(group, "g"),
            other => panic!("expected Fenced, got {other:?}"),
        }
        assert!(matches!(
            check("g", fence, None),
            Err(QueueError::Fenced { current: None, .. })
        ));
    }
}
