//! What sink kinds share and no user names: the thread each sink runs on and its queue
//! (`runner`), the network sinks' message, mode and server URL (`net`), the delivery of the
//! streaming sinks (`stream`), and names that never overwrite (`naming`). Kept apart from the kinds so that `ls src/sinks` lists the kinds
//! a pipeline file can name.

pub(super) mod naming;
pub(super) mod net;
pub(super) mod runner;
pub(super) mod stream;
