"""``python -m ihsweep.cost``: the cost table of a study (``ihsweep.cost.report``)."""

from ihsweep.cost.report import main

raise SystemExit(main())
