//! Errors of plan construction and scheduling.

/// What is wrong with a plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A launch names a buffer, stream or event the plan does not declare.
    #[error("launch #{launch} ({name}) refers to undeclared {what} {id}")]
    Undeclared {
        /// Index of the launch.
        launch: usize,
        /// Its name.
        name: String,
        /// "buffer", "stream" or "event".
        what: &'static str,
        /// The id used.
        id: u32,
    },
    /// A slice reaches past the end of its buffer.
    #[error(
        "launch #{launch} ({name}) touches bytes {start}..{end} of buffer `{buffer}`, which has \
         only {bytes}"
    )]
    OutOfBounds {
        /// Index of the launch.
        launch: usize,
        /// Its name.
        name: String,
        /// The buffer's name.
        buffer: String,
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
        /// The buffer's size.
        bytes: u64,
    },
    /// An event is recorded by more than one launch.
    #[error("event `{event}` is recorded by launch #{first} and again by launch #{second}")]
    RecordedTwice {
        /// The event's name.
        event: String,
        /// The first recorder.
        first: usize,
        /// The second recorder.
        second: usize,
    },
    /// A launch waits for an event that no earlier launch records.
    #[error(
        "launch #{launch} ({name}) waits for event `{event}`, which no earlier launch records \
         (a wait on an unrecorded event orders nothing)"
    )]
    WaitBeforeRecord {
        /// Index of the launch.
        launch: usize,
        /// Its name.
        name: String,
        /// The event's name.
        event: String,
    },
    /// An execution order given for a plan is not a permutation of its launches.
    #[error("the order given is not a permutation of the plan's {launches} launches")]
    NotAnOrder {
        /// Launches in the plan.
        launches: usize,
    },
}
