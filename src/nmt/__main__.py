"""`python -m nmt <stage>` is the same as the `nmt` console script."""

from nmt.cli import main

raise SystemExit(main())
