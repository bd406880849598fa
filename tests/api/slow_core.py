"""An engine core that takes a minute to import: `--core tests.api.slow_core:Core` holds an
engine core process in its loading phase (tests/api/test_engine_process.py). Importing it
touches $SLOW_CORE_MARK first, so a test knows the core got that far."""

import os
import time
from pathlib import Path

Path(os.environ["SLOW_CORE_MARK"]).touch()
time.sleep(60)

Core = None
