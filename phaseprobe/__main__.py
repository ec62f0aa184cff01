"""``python -m phaseprobe`` is the ``phaseprobe`` command."""

import sys

from phaseprobe.present.cli import main

sys.exit(main())
