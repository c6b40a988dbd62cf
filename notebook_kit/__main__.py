"""``python -m notebook_kit``: the ``notebook-kit`` command, for environments without the script."""

import sys

from notebook_kit.cli.main import main

sys.exit(main())
