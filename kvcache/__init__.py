"""The paged KV cache: tensors (pool.py), block bookkeeping (block_allocator.py) and the
per-sequence view of it (kv_cache_manager.py). Knows shapes, not the model."""
