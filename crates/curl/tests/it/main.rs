//! `idemcurl` as a process: against the testkit's receiver (replay, races, a kill mid-request,
//! refusals, each exit status) and against real curl (the same request on the wire).

mod cut_answers;
mod parity;
mod process;
mod sealed;
mod support;
mod tls;
mod unsaved_answers;
