"""plotly.js served from the plotly Python package's own bundle, not a vendored copy: the charts' library is then
always the release the figures are built and checked against (`pip install` upgrades both at once)."""

from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PACKAGE_DATA = Path(plotly.__file__).resolve().parent / "package_data"
BUNDLE = "plotly.min.js"
PREFIX = "vendor"
STATIC_PATH = f"{PREFIX}/{BUNDLE}"  # what templates ask for: {% static 'vendor/plotly.min.js' %}


class PlotlyBundleFinder(BaseFinder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=PACKAGE_DATA)
        self.storage.prefix = PREFIX  # collectstatic copies the bundle to STATIC_ROOT/vendor/

    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        if path != STATIC_PATH or not (PACKAGE_DATA / BUNDLE).is_file():
            return []
        found = str(PACKAGE_DATA / BUNDLE)
        return [found] if find_all else found

    def list(self, ignore_patterns):
        if (PACKAGE_DATA / BUNDLE).is_file():
            yield BUNDLE, self.storage
