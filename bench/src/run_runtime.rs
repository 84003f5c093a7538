//! The run's rrpc runtime settings for the contexts that `txn-bench`'s own tools create
//! (audits, the recoverer, the replica view manager, Lotus's resharder): the same
//! settings as its coordinators' ([`crate::txn_args::Args::runtime`]: the topology
//! file's `[runtime]` with `--config`'s over it), so that a tool's Rocket fits what the
//! services it reads admit and its calls time out as the coordinators' do. Set once per
//! run by `txn-bench` (and by a coordinator process from its run spec), like the audits'
//! replica view ([`crate::audit::set_run_view`]); the defaults until then.

use std::sync::Mutex;

use rrpc::runtime::RuntimeConfig;

static RUN_RUNTIME: Mutex<Option<RuntimeConfig>> = Mutex::new(None);

/// The tools of this run build their runtime contexts with `runtime`.
pub(crate) fn set(runtime: RuntimeConfig) {
    *RUN_RUNTIME.lock().unwrap_or_else(|e| e.into_inner()) = Some(runtime);
}

/// The runtime settings a tool's context takes: the run's ([`set`]), else the defaults.
pub(crate) fn get() -> RuntimeConfig {
    RUN_RUNTIME
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_default()
}
