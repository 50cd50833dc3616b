import sys

from conveyor.cli.main import main

sys.exit(main())
