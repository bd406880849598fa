"""The live dashboard: GET /dashboard, a static page fed by engine snapshots over SSE."""
