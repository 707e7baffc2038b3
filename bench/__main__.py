"""`python -m omni_bench ...`: see omni_bench.cli."""
from omni_bench.cli import main

raise SystemExit(main())
