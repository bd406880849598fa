"""The engine core in a process of its own (the default): loop.py is that process, client.py
the API process's side of it, and the rest what passes between them (see client.py's doc)."""
