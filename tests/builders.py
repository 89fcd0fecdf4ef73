"""The test builders live in the package (transferset/testing.py), for users' own tests too; the
project's tests keep importing them as `builders`."""
from transferset.testing import *  # noqa: F401,F403
