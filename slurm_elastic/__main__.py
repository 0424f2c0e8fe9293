import sys

from slurm_elastic.cli import main

sys.exit(main())
