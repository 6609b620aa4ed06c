"""``python -m ihsweep.status`` (``ihsweep.status`` documents it)."""

from ihsweep.status import __doc__ as description
from ihsweep.status.command import main

raise SystemExit(main(description=description))
