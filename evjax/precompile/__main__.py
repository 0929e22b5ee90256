"""``python -m evjax.precompile``: see :mod:`evjax.precompile`."""
from . import main

raise SystemExit(main())
