"""Child process for test_convert_signals: ``weightplan convert`` as the program runs it,
pausing once its temporaries exist (commit step ``created``) until a signal arrives.

    python convert_child.py SRC DST

It prints ``ready`` on stderr at the pause and leaves with the command's exit status.
"""

import sys
import time

from weightplan.cli import main
from weightplan.executor import commit


def pause(step: str) -> None:
    if step == "created":
        print("ready", file=sys.stderr, flush=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the signal arrives here (main thread)
            time.sleep(0.01)


commit.STEP_HOOK = pause
sys.exit(main(["convert", sys.argv[1], sys.argv[2], "--model-type", "mixtral",
               "--threads", "0", "--max-shard-size", "2KB"]))
