//! murmur's built-in models, datasets and optimizers, on candle.
//!
//! Empty until the trainer lands; the crate exists so the workspace has its final shape.
