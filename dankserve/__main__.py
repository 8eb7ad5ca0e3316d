"""`python -m dankserve`."""

from dankserve.cli.main import main

if __name__ == "__main__":
    main()
