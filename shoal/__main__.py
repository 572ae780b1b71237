import sys

from shoal.cli.main import main

sys.exit(main())
