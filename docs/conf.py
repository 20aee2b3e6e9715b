"""The course as a book: every notebook executed, with a table of contents, search and launch buttons.

Built with Sphinx + MyST-NB + sphinx-book-theme (as the JAX and Flax docs are) by ``make book``::

    sphinx-build -W --keep-going -b html -d build/book/doctrees docs build/book/html

``docs/notebooks`` is a link to the repository's ``notebooks/`` folder, so every page is built from the
committed ``notebooks/NN_name.ipynb`` itself; only those and ``index.md`` are sources (not the ``.py``
twins, not ``conftest.py``). The notebook list, the titles and the repository address come from
``spmd_course.course``: a new notebook appears in the book without any change here.

Execution: MyST-NB's cache mode (outputs kept in ``build/book/jupyter_cache``, a notebook re-runs only
when its code changes), each kernel started in ``notebooks/`` with the course's environment variables.
Notebooks that need torch_xla run only where it is installed; ``make book`` executes them into the same
cache with ``.venv-xla`` first when that environment exists (``docs/execute_cached.py``). Otherwise their
page shows the code without outputs, and says so.
"""

from __future__ import annotations

import html
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from docutils import nodes
from sphinx import addnodes
from sphinx.util import logging

from spmd_course.course import (
    BRANCH,
    REPO,
    XLA_NOTEBOOKS,
    binder_url,
    colab_url,
    launchable,
    notebooks,
    runnable_here,
    title_and_promise,
)

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent


def _sibling(name: str) -> ModuleType:
    """A module of docs/ (a folder of scripts, not a package), loaded without putting docs/ on sys.path."""
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_cached = _sibling("execute_cached")
CACHE, TIMEOUT, is_cached, set_course_environment = (
    _cached.CACHE, _cached.TIMEOUT, _cached.is_cached, _cached.set_course_environment)


REPO_URL = f"https://github.com/{REPO}"
NOTEBOOKS = notebooks(ROOT)  # the notebooks beside this docs/ (a test builds a miniature copy)
_BUILD = {"xla_executed": False}  # set at config-inited, once the command line's -D options are applied

project = "SPMD automatic sharding in JAX"
author = "The SPMD course authors"
copyright = "The SPMD course authors: prose under CC BY 4.0, code under Apache 2.0"

extensions = ["myst_nb"]
# The sources: this page and the course's notebooks, nothing else under docs/notebooks (.py twins, conftest.py).
include_patterns = ["index.md", *(f"notebooks/{p.name}" for p in NOTEBOOKS)]

# Notebook 07 writes a formula in $...$; it is rendered to MathML here (see setup), no MathJax from a CDN.
myst_enable_extensions = ["dollarmath"]
# What index.md leaves to be filled in ({{ notebooks }} ...): MyST's substitutions, which index.md's front matter
# turns on for that page only (a notebook's markdown may show replica groups such as {{0,1},{2,3}}).
html_math_renderer = "mathml"

nb_execution_mode = "cache"
nb_execution_cache_path = str(CACHE)
nb_execution_timeout = TIMEOUT
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
# A widget cannot run in a static page, and MyST-NB would fetch its JavaScript from CDNs: show a
# widget's text or HTML fallback instead, so the book reads offline.
nb_ipywidgets_js = {}
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
set_course_environment()  # kernels inherit this process's environment

html_theme = "sphinx_book_theme"
html_title = "SPMD sharding in JAX"
html_theme_options = {
    "repository_url": REPO_URL,
    "repository_branch": BRANCH,
    # Pages are named notebooks/NN_name, as in the repository: the launch buttons open that path.
    "path_to_docs": "",
    "use_repository_button": True,
    "launch_buttons": {
        "colab_url": "https://colab.research.google.com",
        "binderhub_url": "https://mybinder.org",
        "notebook_interface": "jupyterlab",
    },
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "navbar_persistent": [],
}


def _docname(path: Path) -> str:
    return f"notebooks/{path.stem}"


def _index_parts() -> dict[str, str]:
    """The substitutions ``index.md`` uses: the notebook list and the links built from REPO."""
    first = NOTEBOOKS[0].name
    rows = []
    for path in NOTEBOOKS:
        title, promise = title_and_promise(path)
        promise = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", promise)  # a link relative to the notebook: its text
        rows.append(f"- [{path.stem[:2]} · {title}]({_docname(path)}.ipynb): {promise}")
    toctree = "\n".join(["```{toctree}", ":hidden:", ":caption: Notebooks", ""] + [_docname(p) for p in NOTEBOOKS])
    return {
        "notebooks": "\n".join(rows) + "\n\n" + toctree + "\n```",
        "repository": f"[{REPO}]({REPO_URL})",
        "colab_first": f"[Colab]({colab_url(first)})",
        "binder_first": f"[Binder]({binder_url(first)})",
    }


myst_substitutions = _index_parts()


def xla_executed(app) -> bool:
    """Whether this build shows the outputs of the notebooks that need torch_xla."""
    mode = app.config.nb_execution_mode
    return mode != "off" and all(
        runnable_here(p) or (mode == "cache" and is_cached(p, Path(app.config.nb_execution_cache_path)))
        for p in NOTEBOOKS
        if p.name in XLA_NOTEBOOKS
    )


def exclude_xla(app, config) -> None:
    """``config-inited``: execute the torch_xla notebooks only where they can run or are cached."""
    _BUILD["xla_executed"] = xla_executed(app)
    if not _BUILD["xla_executed"]:
        config.nb_execution_excludepatterns = [*config.nb_execution_excludepatterns, *sorted(XLA_NOTEBOOKS)]


def _is_remote_badge(node: nodes.Node) -> bool:
    images = list(node.findall(nodes.image)) if isinstance(node, nodes.reference) else []
    return len(images) == 1 and images[0]["uri"].startswith(("http://", "https://"))


def fix_notebook_links(app, doctree: nodes.document) -> None:
    """``doctree-read``: links between notebooks name their page, not the file behind docs/notebooks.

    Sphinx resolves a link such as ``[01 · Device meshes](01_meshes.ipynb)`` through the symbolic link,
    to a path outside the source folder; this maps it back to the page ``notebooks/01_meshes``.
    """
    real = Path(app.srcdir, "notebooks").resolve().as_posix() + "/"
    for xref in doctree.findall(addnodes.pending_xref):
        if xref.get("refdomain") == "doc" and xref.get("reftarget", "").startswith(real):
            xref["reftarget"] = "notebooks/" + xref["reftarget"][len(real):]


def adapt_notebook_page(app, doctree: nodes.document) -> None:
    """``doctree-read``: IPython highlighting, no launch badges, the torch_xla note.

    Code cells are IPython (magics allowed): an executed notebook gets that lexer from its kernel, a stored
    one says "python"; the same highlighting either way. Each notebook starts with Colab and Binder
    badges, images on the web that an offline reader cannot load: the theme's launch buttons (the rocket
    at the top of the page) replace them.
    """
    docname = app.env.docname
    if not docname.startswith("notebooks/"):
        return
    for block in doctree.findall(nodes.literal_block):
        if block.get("language") == "python":
            block["language"] = "ipython3"
    for paragraph in list(doctree.findall(nodes.paragraph)):
        parts = [c for c in paragraph.children if not (isinstance(c, nodes.Text) and not c.strip())]
        if parts and all(_is_remote_badge(c) for c in parts):
            paragraph.parent.remove(paragraph)
    if not launchable(Path(docname).name + ".ipynb"):
        note = nodes.note()
        note += nodes.paragraph("", "Colab and Binder cannot run this notebook (it needs its own environment), "
                                "so this page has no launch buttons.")
        if not _BUILD["xla_executed"]:
            note += nodes.paragraph("", "This book was built without ", nodes.literal("", ".venv-xla"),
                                    nodes.Text(", so the page shows the code without outputs. "),
                                    nodes.literal("", "make env-xla"),
                                    nodes.Text(" creates it; the next book build then executes this notebook."))
        section = next(doctree.findall(nodes.section))
        section.insert(section.first_child_not_matching_class(nodes.title) or len(section), note)


def drop_xla_launch_buttons(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    """``html-page-context``, after the theme's: no Colab/Binder buttons where the notebook cannot run.

    sphinx-book-theme (1.4) has no option for that on one page: it adds its buttons to every notebook page as the
    header button labelled "launch-buttons". Where that label is missing (a theme update), the build warns,
    so ``make book`` (-W) fails rather than keep buttons that cannot work."""
    if pagename.startswith("notebooks/") and not launchable(Path(pagename).name + ".ipynb"):
        buttons = context["header_buttons"]
        context["header_buttons"] = [b for b in buttons if b.get("label") != "launch-buttons"]
        if len(context["header_buttons"]) == len(buttons):
            logging.getLogger(__name__).warning(f"{pagename}: no 'launch-buttons' header button to remove: "
                                                "did sphinx-book-theme rename it? See docs/conf.py")


def _mathml(latex: str, node: nodes.Node, block: bool) -> str:
    """MathML for a LaTeX formula (docutils' converter); a formula it cannot convert is a build warning."""
    from docutils.utils.math.latex2mathml import tex2mathml

    try:
        return tex2mathml(latex, as_block=block)
    except SyntaxError as err:
        logging.getLogger(__name__).warning(f"math not rendered ({err}): {latex}", location=node)
        return f"<code>{html.escape(latex)}</code>"


def visit_math(self, node: nodes.math) -> None:
    self.body.append(self.starttag(node, "span", "", CLASS="math"))
    self.body.append(_mathml(node.astext(), node, block=False) + "</span>")
    raise nodes.SkipNode


def visit_math_block(self, node: nodes.math_block) -> None:
    self.body.append(self.starttag(node, "div", CLASS="math"))
    self.body.append(_mathml(node.astext(), node, block=True) + "</div>\n")
    raise nodes.SkipNode


def setup(app) -> None:
    # Formulas as MathML, which browsers render natively: no script, nothing fetched, readable offline.
    app.add_html_math_renderer("mathml", (visit_math, None), (visit_math_block, None))
    app.connect("config-inited", exclude_xla)
    app.connect("doctree-read", fix_notebook_links)
    app.connect("doctree-read", adapt_notebook_page)
    app.connect("html-page-context", drop_xla_launch_buttons, priority=900)
