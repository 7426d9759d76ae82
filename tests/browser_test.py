#!/usr/bin/env python3
"""The HTML reports in a real browser (ctest BrowserHtmlReports).

Writes each kind of report with the built trainmem (--format html, and --format json for the
figures to compare), loads every page in headless Chromium driven over the DevTools protocol
(--remote-debugging-pipe, stdlib only) with JavaScript on and off, and checks:
  - no console errors and no uncaught exceptions;
  - the page's tables as the browser parsed them carry the JSON report's key figures;
  - the charts (per-layer bars of every profile, sweep --fit's points, lines and residuals,
    diff's tensor-by-tensor bars): every bar's and point's data-* figure is the JSON report's,
    every mark is laid out and carries its <title> tooltip, with JavaScript on and off;
  - profile: the table of live tensors lists, at the peak (JS off: as written; JS on: after
    hovering the peak instant of the SVG), tensors whose bytes per category are the ledger's
    peak breakdown, the peak's tensor among them; hovering another instant lists another set.
Usage: browser_test.py TRAINMEM_BINARY [--screenshots DIR]
Exits 77 (ctest SKIP_RETURN_CODE) with the reason when Chromium is absent.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import queue

SKIP = 77

KINDS = {
    "estimate": "estimate --model llama2-7b --batch 4 --seq 2048 --optimizer all --profile all",
    "profile": "profile --model llama2-7b --batch 2 --seq 1024 --backend meta",
    "compare": "compare --model tiny --batch 2 --seq 16 --backend meta --optimizer all",
    "sweep": "sweep --model tiny --backend meta --batch 1,2 --seq 16,24 --fit",
    "maxbatch": "maxbatch --model tiny --seq 32 --budget 40MiB",
    "diff": "diff hf-eager native --model llama2-7b --batch 1 --seq 1024",
    "ranks": "estimate --model llama2-70b --batch 1 --seq 4096 --world-size 16 --tp 8 --pp 2",
}

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Headless Chromium over --remote-debugging-pipe (fd 3: commands in, fd 4: replies)."""

    def __init__(self, exe, profile_dir):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds():
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--hide-scrollbars", "--user-data-dir=" + profile_dir, "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._next = 0
        self._replies = {}
        self._cond = threading.Condition()
        self.events = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        buf = b""
        while True:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                with self._cond:
                    self._replies[None] = True
                    self._cond.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                m = json.loads(msg)
                if "id" in m:
                    with self._cond:
                        self._replies[m["id"]] = m
                        self._cond.notify_all()
                else:
                    self.events.put(m)

    def send(self, method, params=None, session=None, timeout=60):
        self._next += 1
        mid = self._next
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        with self._cond:
            ok = self._cond.wait_for(lambda: mid in self._replies or None in self._replies,
                                     timeout)
            if not ok or mid not in self._replies:
                raise RuntimeError("no reply to " + method)
            m = self._replies.pop(mid)
        if "error" in m:
            raise RuntimeError(method + ": " + json.dumps(m["error"]))
        return m.get("result", {})

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Page:
    def __init__(self, browser, js):
        self.b = browser
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.s = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"]
        for m in ("Page.enable", "Runtime.enable", "Log.enable"):
            browser.send(m, session=self.s)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1280, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
                     session=self.s)
        if not js:
            browser.send("Emulation.setScriptExecutionDisabled", {"value": True}, session=self.s)
        self.errors = []

    def _drain(self, until=None, timeout=60):
        import time
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                if until:
                    raise RuntimeError("timed out waiting for " + until)
                return
            try:
                ev = self.b.events.get(timeout=left if until else 0.3)
            except queue.Empty:
                if until:
                    continue
                return
            if ev.get("sessionId") != self.s:
                continue
            method, p = ev.get("method"), ev.get("params", {})
            if method == "Runtime.exceptionThrown":
                self.errors.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:400])
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                self.errors.append("console.error: " + json.dumps(p.get("args", []))[:400])
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                self.errors.append("log: " + p["entry"].get("text", ""))
            if until and method == until:
                return

    def open(self, path):
        self.b.send("Page.navigate", {"url": "file://" + os.path.abspath(path)}, session=self.s)
        self._drain(until="Page.loadEventFired")
        self._drain()  # what the load itself logs

    def eval(self, expr):
        r = self.b.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                        session=self.s)
        if "exceptionDetails" in r:
            raise RuntimeError("evaluate: " + json.dumps(r["exceptionDetails"])[:400])
        return r["result"].get("value")

    def hover(self, selector):
        box = self.eval("(function(){var r=document.querySelector(%s).getBoundingClientRect();"
                        "return [r.left+r.width/2, r.top+r.height/2];})()" % json.dumps(selector))
        self.eval("document.querySelector(%s).scrollIntoView({block:'center'})"
                  % json.dumps(selector))
        box = self.eval("(function(){var r=document.querySelector(%s).getBoundingClientRect();"
                        "return [r.left+r.width/2, r.top+r.height/2];})()" % json.dumps(selector))
        self.b.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": 1, "y": 1},
                    session=self.s)
        self.b.send("Input.dispatchMouseEvent",
                    {"type": "mouseMoved", "x": box[0], "y": box[1]}, session=self.s)
        self._drain()

    def screenshot(self, path, selector=None):
        if selector:
            self.eval("document.querySelector(%s).scrollIntoView({block:'start'})"
                      % json.dumps(selector))
        else:
            self.eval("window.scrollTo(0,0)")
        data = self.b.send("Page.captureScreenshot", {"format": "png"}, session=self.s)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))


TABLES_JS = ("JSON.stringify(Array.from(document.querySelectorAll('main table')).map(function(t){"
             "return Array.from(t.rows).map(function(r){return Array.from(r.cells)"
             ".map(function(c){return c.textContent;});});}))")
LIVE_JS = ("JSON.stringify(Array.from(document.querySelectorAll('#live-table tbody tr'))"
           ".map(function(r){return Array.from(r.cells).map(function(c){return c.textContent;});}))")


def run(binary, args, fmt):
    r = subprocess.run([binary] + args.split() + ["--format", fmt], capture_output=True, text=True,
                       env=dict(os.environ, NO_COLOR="1"))
    if r.returncode != 0:
        raise RuntimeError("trainmem %s --format %s: exit %d\n%s" % (args, fmt, r.returncode,
                                                                    r.stderr))
    return r.stdout


def in_unit(bytes_, unit):
    return "%.2f" % (bytes_ / UNITS[unit])


def unit_of(header):
    # "measured (MiB)" -> MiB
    return header[header.rindex("(") + 1:header.rindex(")")]


class Failures:
    def __init__(self):
        self.list = []

    def eq(self, got, want, what):
        if got != want:
            self.list.append("%s: page %r, JSON %r" % (what, got, want))

    def true(self, cond, what):
        if not cond:
            self.list.append(what)


def check_figures(kind, tables, j, fail, tag, unit):
    """The key figures of each kind of report, in the page's tables, against its JSON."""
    w = kind + " (" + tag + ")"
    fail.true(len(tables) > 0, w + ": no table")
    if not tables:
        return
    if kind == "profile":
        t = tables[0]
        fail.eq(t[0][0], "category", w + " reconciliation header")
        u = unit_of(t[0][1])
        rec = {row["category"]: row for row in j["reconciliation"]}
        fail.eq(len(t) - 1, len(rec), w + " reconciliation rows")
        for row in t[1:]:
            want = rec.get(row[0])
            fail.true(want is not None, w + " unknown category " + row[0])
            if want:
                fail.eq(row[1], in_unit(want["measured"], u), w + " measured " + row[0])
                fail.eq(row[2], in_unit(want["analytic"], u), w + " analytic " + row[0])
                fail.eq(row[-1], "yes" if want["ok"] else "NO", w + " ok " + row[0])
    elif kind == "compare":
        t = tables[0]
        fail.eq(len(t) - 1, len(j["runs"]), w + " runs")
        u = unit  # the unit is in the heading above the table
        peak_col = t[0].index("Peak")
        for k, run_ in enumerate(j["runs"]):
            row = t[k + 1]
            fail.eq(row[0].lower(), run_["run"]["optimizer"], w + " optimizer %d" % k)
            fail.eq(row[1], run_["run"]["checkpointing"], w + " checkpointing %d" % k)
            fail.eq(row[peak_col], in_unit(run_["measured"]["ledger"]["peak"], u),
                    w + " peak %d" % k)
    elif kind == "sweep":
        t = tables[0]
        fail.eq(len(t) - 1, len(j["runs"]), w + " runs")
        hb, hs = t[0].index("b") if "b" in t[0] else None, t[0].index("s") if "s" in t[0] else None
        for k, run_ in enumerate(j["runs"]):
            if hb is not None:
                fail.eq(t[k + 1][hb], str(run_["run"]["batch"]), w + " batch %d" % k)
            if hs is not None:
                fail.eq(t[k + 1][hs], str(run_["run"]["seq"]), w + " seq %d" % k)
    elif kind == "maxbatch":
        t = tables[0]
        fail.eq(t[1][0], str(j["batch"]), w + " batch")
        fail.eq(t[2][0], str(j["batch"] + 1), w + " next batch")
        u = unit_of(t[0][1])
        fail.eq(t[1][1], in_unit(j["peak"], u), w + " peak")
        fail.eq(t[2][1], in_unit(j["next_peak"], u), w + " next peak")
        fail.eq(t[1][-1], "yes", w + " fits")
        fail.eq(t[2][-1], "NO", w + " next fits")
    elif kind == "estimate":
        t = tables[0]
        h = t[0]
        fail.eq(len(t) - 1, sum(len(r["analytic"]) for r in j["runs"]), w + " rows")
        cols = {"Params": "params", "Gradients": "gradients",
                "Optimizer States": "optimizer_states", "Activations": "activations",
                "Total": "sum", "Peak": "peak"}
        for row in t[1:]:
            run_ = next(r for r in j["runs"] if r["run"]["optimizer"] == row[0]
                        and r["run"]["checkpointing"] == row[1])
            a = run_["analytic"][row[2]]
            for head, key in cols.items():
                fail.eq(row[h.index(head)], in_unit(a[key], unit), w + " %s %s" % (row[:3], key))
    elif kind == "diff":
        t = tables[0]
        cats = {c["category"]: c for c in j["categories"]}
        fail.eq(len(t) - 1, len(cats), w + " categories")
        for row in t[1:]:
            c = cats[row[0]]
            fail.eq(row[1], in_unit(c["a"], unit), w + " A " + row[0])
            fail.eq(row[2], in_unit(c["b"], unit), w + " B " + row[0])
            d = c["delta"]
            fail.eq(row[4], ("+" if d > 0 else "-" if d < 0 else "") + "{:,}".format(abs(d)),
                    w + " delta bytes " + row[0])
    elif kind == "ranks":
        pass  # its figures: the Markdown report's (below) and test_cli_layout.cpp's


def marks_js(chart_id, selector):
    """The marks `selector` of the chart <svg id=chart_id>, as the browser laid them out: their
    data-* attributes, their <title> tooltip and their drawn size."""
    return ("JSON.stringify(Array.from(document.querySelectorAll('svg#%s %s')).map(function(e){"
            "var r=e.getBoundingClientRect(),t=e.querySelector('title');"
            "return {data:Object.assign({},e.dataset),title:t?t.textContent:null,"
            "w:r.width,h:r.height,cls:e.getAttribute('class')};}))" % (chart_id, selector))


def run_objects(j):
    return j["runs"] if "runs" in j else [j]


def check_charts(kind, page, j, fail, tag):
    """The drawn charts (issue 17) against the JSON report: every bar's and point's figure."""
    w = kind + " (" + tag + ")"

    def marks(chart_id, selector):
        return json.loads(page.eval(marks_js(chart_id, selector)))

    def drawn(ms, what):
        # Each mark is laid out (non-empty) and carries its tooltip.
        fail.true(all(m["w"] > 0 and m["h"] > 0 for m in ms), w + " " + what + ": a mark not drawn")
        fail.true(all(m["title"] for m in ms), w + " " + what + ": a mark without its tooltip")

    if kind in ("estimate", "profile", "compare"):
        bars = marks("per-layer-chart", "rect.bar")
        runs = run_objects(j)
        first_opt = runs[0]["run"]["optimizer"]
        fail.true(len(bars) > 0, w + ": no per-layer bars")
        drawn(bars, "per-layer bars")
        for b in bars:
            series = b["data"]["series"]
            run_ = next((r for r in runs if r["run"]["optimizer"] == first_opt and
                         (not series or series == "checkpointing " + r["run"]["checkpointing"])),
                        None)
            fail.true(run_ is not None, w + ": per-layer bar of an unknown run " + series)
            if run_ is None:
                continue
            group = b["data"]["group"]
            if group.startswith("measured"):
                want = run_["measured"]["ledger"]["per_layer_activations"]
            else:
                want = run_["analytic"][group]["per_layer_activations"]
            fail.eq(int(b["data"]["v"]), want, w + " per-layer bar " + group + " " + series)
            fail.true("{:,} B".format(want) in b["title"],
                      w + " per-layer tooltip " + group + ": " + b["title"])
        want_n = sum(len(r["analytic"]) + ("measured" in r)
                     for r in runs if r["run"]["optimizer"] == first_opt)
        fail.eq(len(bars), want_n, w + " per-layer bars")
        # More bytes, a longer bar.
        order = sorted(bars, key=lambda b: int(b["data"]["v"]))
        fail.true(all(order[i]["w"] <= order[i + 1]["w"] + 0.01 for i in range(len(order) - 1)),
                  w + ": per-layer bar widths out of the figures' order")
    if kind == "sweep":
        points = marks("fit-chart", "circle.point")
        lines = marks("fit-chart", "line.fit")
        res_bars = marks("residual-chart", "rect.bar")
        fit = j["fit"]["ledger"]
        fail.eq(len(points), len(j["runs"]), w + " fit points")
        fail.eq(len(res_bars), len(j["runs"]), w + " residual bars")
        fail.eq(sorted({l["data"]["seq"] for l in lines}),
                sorted({str(r["run"]["seq"]) for r in j["runs"]}), w + " a fitted line per seq")
        drawn(points, "fit points")
        slope = {l["data"]["seq"]: float(l["data"]["slope"]) for l in lines}
        for k, (p, r) in enumerate(zip(points, j["runs"])):
            fail.eq(int(p["data"]["batch"]), r["run"]["batch"], w + " point %d batch" % k)
            fail.eq(int(p["data"]["seq"]), r["run"]["seq"], w + " point %d seq" % k)
            fail.eq(float(p["data"]["y"]), r["measured"]["ledger"]["per_layer_activations"],
                    w + " point %d measured" % k)
            fail.eq(float(p["data"]["residual"]), fit["residuals"][k], w + " point %d residual" % k)
            fail.eq(float(res_bars[k]["data"]["v"]), fit["residuals"][k],
                    w + " residual bar %d" % k)
            fitted = float(p["data"]["fitted"])
            tokens = r["run"]["batch"] * r["run"]["seq"]
            fail.true(abs(slope[p["data"]["seq"]] * tokens - fitted) <= 1e-6 * fitted,
                      w + " point %d not on its line" % k)
    if kind == "diff":
        bars = marks("diff-chart", "rect.bar")
        changed = {t["group"] + " / " + t["name"]: t["delta"] for t in j["tensors"] if t["delta"]}
        fail.eq(len(bars), min(24, len(changed)), w + " diff bars")
        drawn(bars, "diff bars")
        deltas = []
        for b in bars:
            d = changed.get(b["data"]["group"])
            fail.true(d is not None, w + ": a bar for an unchanged tensor " + b["data"]["group"])
            if d is None:
                continue
            fail.eq(int(b["data"]["v"]), d, w + " Δ " + b["data"]["group"])
            fail.eq("neg" in b["cls"].split(), d < 0, w + " sign " + b["data"]["group"])
            deltas.append(abs(d))
        fail.eq(deltas, sorted(deltas, reverse=True), w + ": diff bars largest first")
        if deltas:
            fail.true(sum(abs(d) > deltas[-1] for d in changed.values()) <= len(deltas),
                      w + ": a larger Δ left out of the chart")
        pl = marks("per-layer-chart", "rect.bar")
        fail.eq([int(b["data"]["v"]) for b in pl],
                [j["per_layer"]["a_bytes"], j["per_layer"]["b_bytes"]], w + " per-layer A, B")


def check_live(page, j, fail, tag, expect_js):
    """The live-tensor table at the peak against the ledger's peak breakdown."""
    rows = json.loads(page.eval(LIVE_JS))
    by_cat = {}
    for name, layer, cat, bytes_, phase in rows:
        by_cat[cat] = by_cat.get(cat, 0) + int(bytes_.replace(",", ""))
    led = j["measured"]["ledger"]
    want = {k: v for k, v in led["peak_breakdown"].items() if v}
    fail.eq(by_cat, want, "profile (%s): live tensors' bytes per category at the peak" % tag)
    fail.eq(sum(by_cat.values()), led["peak"], "profile (%s): live bytes at the peak" % tag)
    names = [r[0] for r in rows]
    fail.true(led["peak_at"]["tensor"] in names,
              "profile (%s): the peak's tensor %s not listed" % (tag, led["peak_at"]["tensor"]))
    if expect_js:
        page.hover("#instant-0")
        other = json.loads(page.eval(LIVE_JS))
        fail.true(other != rows, "profile (js): hovering instant 0 lists the peak's tensors")
        page.hover("rect.instant.peak")
        again = json.loads(page.eval(LIVE_JS))
        fail.eq(sorted(map(tuple, again)), sorted(map(tuple, rows)),
                "profile (js): hovering the peak")
        # The filter keeps the rows naming what is typed.
        page.eval("var f=document.getElementById('live-filter');f.value='params';"
                  "f.dispatchEvent(new Event('input'))")
        filtered = json.loads(page.eval(LIVE_JS))
        fail.true(0 < len(filtered) < len(rows) and all(
            "params" in " ".join(r).lower() for r in filtered), "profile (js): the filter")
        page.eval("var f=document.getElementById('live-filter');f.value='';"
                  "f.dispatchEvent(new Event('input'))")
        # Sorting by name.
        page.eval("document.querySelector('#live-table th[data-key=\"0\"]').click()")
        sorted_rows = json.loads(page.eval(LIVE_JS))
        fail.true([r[0] for r in sorted_rows] == sorted(r[0] for r in sorted_rows),
                  "profile (js): sorting by name")
        page.eval("document.querySelector('#live-table th[data-key=\"3\"]').click()")
        by_bytes = json.loads(page.eval(LIVE_JS))
        sizes = [int(r[3].replace(",", "")) for r in by_bytes]
        fail.true(sizes == sorted(sizes, reverse=True), "profile (js): sorting by bytes")
        # Every tensor of the step: the records embedded, each one the JSON report lists.
        page.eval("document.getElementById('live-all').click()")
        every = json.loads(page.eval(LIVE_JS))
        embedded = page.eval("JSON.parse(document.getElementById('tm-timeline-data')"
                             ".textContent).tensors.length")
        fail.eq(len(every), embedded, "profile (js): every tensor of the step")
        fail.true(len(every) > len(rows), "profile (js): the step has more tensors than the peak")
        json_names = {t["name"] for t in j["tensors"]}
        fail.true(all(r[0] in json_names for r in every),
                  "profile (js): a listed tensor the JSON report does not list")
        page.eval("document.getElementById('live-peak').click()")
        fail.eq(sorted(map(tuple, json.loads(page.eval(LIVE_JS)))), sorted(map(tuple, rows)),
                "profile (js): back to the peak")
        page.hover("rect.instant.peak")


def markdown_tables(text):
    tables, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in line.strip()[1:-1].split(" | ")]
            if not all(set(c) <= set(":-") and c for c in cells):
                cur.append(cells)
        elif cur:
            tables.append(cur)
            cur = []
    if cur:
        tables.append(cur)
    return tables


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    binary = sys.argv[1]
    shots = sys.argv[sys.argv.index("--screenshots") + 1] if "--screenshots" in sys.argv else None
    exe = find_chromium()
    if not exe:
        print("SKIP: chromium not found (tools/setup.sh installs Debian's chromium)")
        return SKIP
    work = tempfile.mkdtemp(prefix="trainmem_browser_")
    fail = Failures()
    browser = Browser(exe, os.path.join(work, "profile"))
    try:
        for kind, args in KINDS.items():
            html_path = os.path.join(work, kind + ".html")
            with open(html_path, "w") as f:
                f.write(run(binary, args, "html"))
            j = json.loads(run(binary, args, "json"))
            md = markdown_tables(run(binary, args, "markdown"))
            for js in (False, True):
                tag = "js" if js else "no js"
                page = Page(browser, js)
                page.open(html_path)
                fail.eq(page.errors, [], "%s (%s): console errors" % (kind, tag))
                tables = json.loads(page.eval(TABLES_JS))
                # The report's own tables (not the live-tensor table) are the Markdown's.
                own = [t for t in tables if not (t and t[0][:2] == ["tensor", "layer"])]
                fail.eq(own, md, "%s (%s): tables" % (kind, tag))
                # The unit the title or a heading names first: "GiB = 2^30 bytes", "(MiB; ...".
                unit = page.eval("(function(){var m=document.querySelector('main').textContent"
                                 ".match(/(GiB|MiB|KiB)( =|;|\\))/);return m?m[1]:null;})()")
                check_figures(kind, own, j, fail, tag, unit)
                fail.eq(page.eval("document.querySelectorAll('html').length"), 1,
                        kind + " one html")
                if kind == "compare":
                    fail.eq(page.eval("document.querySelectorAll('.side-by-side svg').length"),
                            len(j["runs"]), "compare (%s): a timeline per run" % tag)
                check_charts(kind, page, j, fail, tag)
                if kind == "profile":
                    fail.true(page.eval("!!document.querySelector('#timeline svg rect.instant.peak')"),
                              "profile (%s): the peak instant" % tag)
                    check_live(page, j, fail, tag, js)
                fail.eq(page.errors, [], "%s (%s): console errors after use" % (kind, tag))
                if shots and js:
                    os.makedirs(shots, exist_ok=True)
                    page.screenshot(os.path.join(shots, "html-%s.png" % kind))
                    # The charts below the first screen (estimate's is on it).
                    chart = {"compare": ("per-layer-chart", "per-layer"),
                             "sweep": ("fit-chart", "fit"), "diff": ("diff-chart", "chart")}
                    if kind in chart:
                        page.screenshot(os.path.join(shots, "html-%s-%s.png" % (kind,
                                                                             chart[kind][1])),
                                        "figure:has(#%s)" % chart[kind][0])
                    if kind == "profile":  # the timeline, the peak instant hovered
                        page.hover("rect.instant.peak")
                        page.screenshot(os.path.join(shots, "html-profile-timeline.png"),
                                        "#timeline")
                print("ok  %-9s JavaScript %s" % (kind, "on" if js else "off"))
    finally:
        browser.close()
        shutil.rmtree(work, ignore_errors=True)
    for f in fail.list:
        print("FAIL:", f)
    return 1 if fail.list else 0


if __name__ == "__main__":
    sys.exit(main())
