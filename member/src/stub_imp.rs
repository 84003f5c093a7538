//! Built without the `etcd` feature: the same API, and joining says how to get the real one.

use std::convert::Infallible;
use std::time::Duration;

use crossbeam_channel::Receiver;

use crate::types::Keys;
use crate::{Event, MemberError, MemberInfo, MemberOptions, Role};

/// Never constructed: [`Inner::join`] always fails.
pub(crate) struct Inner(Infallible);

impl Inner {
    pub(crate) fn join(
        _endpoints: &[String],
        _keys: Keys,
        _role: Role,
        _node: u16,
        _ttl: Duration,
        _opts: &MemberOptions,
    ) -> Result<Self, MemberError> {
        Err(MemberError::NoEtcdSupport)
    }
    pub(crate) fn info(&self) -> &MemberInfo {
        match self.0 {}
    }
    pub(crate) fn lease_ttl(&self) -> Duration {
        match self.0 {}
    }
    pub(crate) fn is_live(&self) -> bool {
        match self.0 {}
    }
    pub(crate) fn events(&self) -> Result<Receiver<Event>, MemberError> {
        match self.0 {}
    }
    pub(crate) fn members(&self) -> Result<Vec<MemberInfo>, MemberError> {
        match self.0 {}
    }
    pub(crate) fn revoke(&self, _: u16, _: u64) -> Result<bool, MemberError> {
        match self.0 {}
    }
    pub(crate) fn claim_recovery(&self, _: u16, _: u64) -> Result<bool, MemberError> {
        match self.0 {}
    }
    pub(crate) fn finish_recovery(&self, _: u16, _: u64, _: &str) -> Result<(), MemberError> {
        match self.0 {}
    }
    pub(crate) fn recovered(&self, _: u16, _: u64) -> Result<Option<String>, MemberError> {
        match self.0 {}
    }
    pub(crate) fn wait_recovered(
        &self,
        _: u16,
        _: u64,
        _: Duration,
    ) -> Result<Option<String>, MemberError> {
        match self.0 {}
    }
    pub(crate) fn pending_recoveries(&self) -> Result<Vec<(u16, u64)>, MemberError> {
        match self.0 {}
    }
    pub(crate) fn put_durable(&self, _: &str, _: Vec<u8>) -> Result<(), MemberError> {
        match self.0 {}
    }
    pub(crate) fn get(&self, _: &str) -> Result<Option<Vec<u8>>, MemberError> {
        match self.0 {}
    }
    pub(crate) fn watch_key(
        &self,
        _: &str,
    ) -> Result<crossbeam_channel::Receiver<Option<Vec<u8>>>, MemberError> {
        match self.0 {}
    }
    pub(crate) fn leave(&self) -> Result<(), MemberError> {
        match self.0 {}
    }
}
