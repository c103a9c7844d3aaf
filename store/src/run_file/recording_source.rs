//! A run file's bytes in memory that logs, in order, every read and every
//! read-ahead hint made of it: the tests of read-ahead check that a walk's
//! reads were asked for before they came.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use super::BlockSource;

/// One call made of a [`RecordingSource`]: a byte range read or hinted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SourceCall {
    Hint { offset: u64, len: u64 },
    Read { offset: u64, len: u64 },
}

/// The calls made of a [`RecordingSource`], shared with the test.
pub(crate) type CallLog = Arc<Mutex<Vec<SourceCall>>>;

/// See the module doc.
pub(crate) struct RecordingSource {
    bytes: Vec<u8>,
    calls: CallLog,
}

impl RecordingSource {
    /// The source over `bytes`, and its log.
    pub(crate) fn new(bytes: Vec<u8>) -> (RecordingSource, CallLog) {
        let calls = CallLog::default();
        let source = RecordingSource {
            bytes,
            calls: Arc::clone(&calls),
        };
        (source, calls)
    }

    fn log(&self, call: SourceCall) {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(call);
    }
}

impl BlockSource for RecordingSource {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.log(SourceCall::Read {
            offset,
            len: buf.len() as u64,
        });
        self.bytes.read_exact_at(buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes.len() as u64)
    }

    fn will_need(&self, offset: u64, len: u64) {
        self.log(SourceCall::Hint { offset, len });
    }
}

/// Takes the calls logged so far, leaving the log empty.
pub(crate) fn take_calls(calls: &CallLog) -> Vec<SourceCall> {
    std::mem::take(&mut *calls.lock().unwrap_or_else(PoisonError::into_inner))
}
