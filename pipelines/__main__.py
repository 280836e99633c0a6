import sys

from sublimate.pipelines.cli import main

sys.exit(main())
