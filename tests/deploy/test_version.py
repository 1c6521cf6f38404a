"""One version: CMake's project(VERSION) is the source (the daemon's --version, the C++ client's
name, the Python package's __version__ are generated from it); the images and chart that deploy
it must name the same."""

from __future__ import annotations

import os
import re

import yaml

import deploy_model as dm

REPO = dm.REPO


def project_version() -> str:
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        m = re.search(r"project\(\s*railyard\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", f.read())
    assert m, "CMakeLists.txt: no project(railyard VERSION x.y.z)"
    return m.group(1)


def test_chart_versions_are_the_project_version():
    with open(os.path.join(dm.CHART_DIR, "Chart.yaml")) as f:
        chart = yaml.safe_load(f)
    assert str(chart["appVersion"]) == project_version(), chart
    assert str(chart["version"]) == project_version(), chart


def test_every_railyard_image_tag_is_the_project_version():
    tags = []
    for root, _, files in os.walk(os.path.join(REPO, "deploy")):
        for name in files:
            if not name.endswith((".yaml", ".yml", "Dockerfile")):
                continue
            path = os.path.join(root, name)
            with open(path) as f:
                for lineno, line in enumerate(f, 1):
                    for m in re.finditer(r"railyard/railyard[a-z-]*:([0-9][0-9A-Za-z.\-]*)", line):
                        tags.append((f"{os.path.relpath(path, REPO)}:{lineno}", m.group(1)))
                    m = re.match(r"\s*newTag:\s*['\"]?([0-9][^'\"\s]*)", line)
                    if m:
                        tags.append((f"{os.path.relpath(path, REPO)}:{lineno}", m.group(1)))
    assert len(tags) >= 4, f"found too few image tags to check: {tags}"
    wrong = [(where, tag) for where, tag in tags if tag != project_version()]
    assert not wrong, f"image tags other than {project_version()}: {wrong}"
