//! One attempt of a transaction under a coordinator's protocol: the dispatch from
//! [`Proto`] to the protocols' modules, above them (so that no protocol module and the
//! coordinator import each other).

use txn::history::Access;

use crate::coord::{Abort, Coord, Proto, TxnSpec};
use crate::net::Net;

impl<N: Net> Coord<N> {
    /// Run one attempt of `t` under this coordinator's protocol and variant; on commit,
    /// the records read (with the version read) and written (with the version
    /// installed), for the serializability check. Errors: [`Abort`];
    /// [`Abort::Unsupported`] for CALVIN, which runs whole epochs
    /// ([`crate::calvin::drive`]).
    pub async fn run(&self, t: &TxnSpec) -> Result<Vec<Access>, Abort> {
        match self.proto {
            Proto::NoWait | Proto::WaitDie => crate::twopl::run(self, t).await,
            Proto::Occ => crate::occ::run(self, t).await,
            Proto::Mvcc => crate::mvcc::run(self, t).await,
            Proto::Sundial => crate::sundial::run(self, t).await,
            Proto::Calvin => Err(Abort::Unsupported(
                "CALVIN runs epochs of sequenced transactions, not single ones: use calvin::drive",
            )),
        }
    }
}
