//! What sink kinds share and no user names: the thread each sink runs on and its queue
//! (`runner`), the network sinks' message, mode and server URL (`net`), the delivery of the
//! streaming sinks (`stream`), names that never overwrite (`naming`), what triggers a
//! `snapshot` or `clip` (`when`), and the loop of the sinks that write a source's record
//! stream as sent (`packet_thread`: `record`, `clip` in packets mode). Kept apart from the
//! kinds so that `ls src/sinks` lists the kinds a pipeline file can name.

pub(super) mod naming;
pub(super) mod net;
pub(super) mod packet_thread;
pub(super) mod runner;
pub(super) mod stream;
pub(super) mod when;
