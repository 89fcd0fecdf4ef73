"""`python -m transferset.app.cli ...` (torchrun launches it so): the `transferset` command."""
import sys

from transferset.app.cli import main

sys.exit(main())
