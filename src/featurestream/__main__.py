import sys

from featurestream.cli import main

sys.exit(main())
