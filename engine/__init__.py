"""The continuous-batching engine: requests, scheduling, running the model, sampling."""
