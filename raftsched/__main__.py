"""``python -m raftsched`` is the ``raftsched`` command."""

from __future__ import annotations

import sys

from raftsched.faces.cli import main

sys.exit(main())
