import sys

from attnlab.cli.main import main

sys.exit(main())
