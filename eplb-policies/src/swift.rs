//! Placeholder: see the policies issue.
