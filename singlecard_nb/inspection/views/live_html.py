"""The live view's HTML: a ranked table drawn in Python, and a small script that searches,
sorts, pins and expands it in the browser.

Why plain HTML and inline JavaScript, not a widget library: the view must stay usable while the
cell that trains is still running, when the kernel cannot answer widget callbacks; an output
updated through `display_id` is re-rendered by the front-end whatever the kernel does, and its
script runs in JupyterLab 4, Notebook 7 and VS Code alike with no extension to install (anywidget
and ipydatagrid need their front-end extension; itables' widget too). The script keeps what the
user did (search, sort, pins, open groups, the caret) in `window` under the view's id, so every
update redraws it as it was. Without scripts (a saved, untrusted notebook, GitHub, nbconvert)
the table drawn in Python stays: the same rows, in the same order as the text form. Colours are
tints over the theme's own background and text colour, so light and dark themes both read.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from typing import Any

from ...theme import NO_MATH_CLASSES
from .formatting import escape, num, shape, sparkline, sparklines
from .ranking import NONFINITE, Row, flatten

SPARK_STEPS = 30  # steps drawn in a row's sparkline

_renders = itertools.count(1)

# (key, heading, numeric): the table's columns, the first (pin) and last (trend) included; a
# row sent to the script has a field of each key (a column sorts by it; "module" is the path).
COLUMNS = (("pin", "", False), ("rank", "#", True), ("module", "module", False),
           ("type", "type", False), ("shape", "shape", False), ("why", "why shown", False),
           ("absmax", "absmax", True), ("std", "std", True), ("mean", "mean", True),
           ("zeros", "zeros", True), ("nan", "nan", True), ("inf", "inf", True),
           ("trend", "absmax trend", False))

# Selectors are two classes deep so they win over JupyterLab's own table rules (which fix the
# layout, stripe odd rows and right-align cells); colours are tints, readable on either theme.
_STYLE = """
.singlecard-live-view{font-size:12px;color:inherit;max-width:100%;overflow-x:auto}
.singlecard-live-view .scn-head{margin-bottom:3px}
.singlecard-live-view .scn-bad{background:rgba(220,40,40,.85);color:#fff;padding:2px 6px}
.singlecard-live-view .scn-controls{display:none;margin:3px 0;gap:10px;align-items:center}
.singlecard-live-view .scn-controls input[type=search]{width:340px;font:inherit;padding:1px 4px;
 color:inherit;background:transparent;border:1px solid rgba(128,128,128,.6);border-radius:2px}
.singlecard-live-view .scn-muted{opacity:.7}
.singlecard-live-view table.singlecard-live{border-collapse:collapse;font-size:11.5px;
 table-layout:auto;width:auto;margin:0}
.singlecard-live-view table.singlecard-live th{text-align:left;padding:1px 6px;
 white-space:nowrap;border-bottom:1px solid rgba(128,128,128,.5);background:none}
.singlecard-live-view.scn-js table.singlecard-live th{cursor:pointer;user-select:none}
.singlecard-live-view table.singlecard-live td{padding:1px 6px;text-align:left;
 font-family:var(--jp-code-font-family,monospace);vertical-align:top;
 border-bottom:1px solid rgba(128,128,128,.15)}
.singlecard-live-view table.singlecard-live td.n{text-align:right;white-space:nowrap}
.singlecard-live-view table.singlecard-live td.m{min-width:200px;max-width:400px;
 overflow-wrap:break-word}
.singlecard-live-view table.singlecard-live td.w{min-width:150px;max-width:240px;
 font-family:inherit}
.singlecard-live-view table.singlecard-live td.s{white-space:nowrap;letter-spacing:-1px}
.singlecard-live-view table.singlecard-live td.p{cursor:pointer;opacity:.5}
.singlecard-live-view table.singlecard-live tr.scn-pinned td.p{opacity:1}
.singlecard-live-view .scn-toggle{cursor:pointer;display:inline-block;width:1.1em}
.singlecard-live-view .scn-sub{font-size:10.5px;opacity:.7;font-family:inherit}
.singlecard-live-view table.singlecard-live tbody tr{background:transparent}
.singlecard-live-view table.singlecard-live tbody tr.scn-t0{background:rgba(230,40,40,.22)}
.singlecard-live-view table.singlecard-live tbody tr.scn-t1{background:rgba(230,40,40,.10)}
.singlecard-live-view table.singlecard-live tbody tr.scn-t2{background:rgba(255,150,0,.16)}
.singlecard-live-view table.singlecard-live tbody tr.scn-t3{background:rgba(255,150,0,.08)}
.singlecard-live-view table.singlecard-live tbody tr.scn-t4{background:rgba(128,128,128,.14)}
.singlecard-live-view table.singlecard-live tr.scn-member td.m{padding-left:22px}
.singlecard-live-view table.singlecard-live td.bad{color:rgb(235,60,60);font-weight:bold}
"""


def _record(row: Row, rank: int, sparks: dict[int, str]) -> dict[str, Any]:
    """One row as the script reads it, by name: a field per column key (COLUMNS, "module" the
    path it sorts by) and the name shown, the tier, the modules with the same output, and a
    group's members (null for a module)."""
    return {"rank": rank, "module": row.path or "(root)", "name": row.name, "type": row.type,
            "shape": shape(row.shape), "why": row.why, "absmax": num(row.absmax),
            "std": num(row.std), "mean": num(row.mean), "zeros": num(row.zeros),
            "nan": row.nan, "inf": row.inf, "trend": sparks[id(row)], "tier": row.tier,
            "same": ", ".join(row.same),
            "members": [_record(m, rank, sparks) for m in row.members] if row.is_group else None}


def _cells(row: Row, rank: int) -> str:
    """A row drawn in Python: what is seen with no script, and the script's first state."""
    sub = []
    if row.is_group:
        sub.append(f"worst: {escape(row.path)} · {len(row.members)} modules")
    if row.same:
        sub.append("same output: " + escape(", ".join(row.same)))
    module = _breakable(row.name) + "".join(f"<div class='scn-sub'>{s}</div>" for s in sub)
    toggle = "<span class='scn-toggle'>▸</span>" if row.is_group else ""
    bad = " bad"
    return (f"<tr class='singlecard-live-row scn-t{row.tier}'>"
            f"<td class='p'>☆</td><td class='n'>{rank}</td><td class='m'>{toggle}{module}</td>"
            f"<td>{escape(row.type)}</td><td>{escape(shape(row.shape))}</td>"
            f"<td class='w'>{escape(row.why)}</td>"
            + "".join(f"<td class='n'>{num(getattr(row, s))}</td>"
                      for s in ("absmax", "std", "mean", "zeros"))
            + f"<td class='n{bad if row.nan else ''}'>{row.nan}</td>"
            f"<td class='n{bad if row.inf else ''}'>{row.inf}</td>"
            f"<td class='s'>{sparkline(row.history[-SPARK_STEPS:])}</td></tr>")


def _breakable(path: str) -> str:
    """Escaped, with a line-break opportunity after each dot: long paths wrap between names."""
    return escape(path).replace(".", ".<wbr>")


def render(rows: list[Row], step: Any, modules: int, state: str, view_id: str,
           top: int) -> str:
    """The whole output: header, NaN banner, controls, the first `top` rows, the data."""
    bad = [p for r in flatten(rows) if r.tier == NONFINITE for p in [r.path or "(root)", *r.same]]
    head = (f"<div class='scn-head'><b>live inspection</b> · step "
            f"{'–' if step is None else step} · {modules} modules in {len(rows)} rows · "
            f"{state} · updated {time.strftime('%H:%M:%S')}</div>")
    if bad:
        names = ", ".join(f"<code>{escape(p)}</code>" for p in bad[:5])
        head += (f"<div class='scn-bad'>NaN/Inf in {len(bad)} module(s): {names}"
                 f"{' …' if len(bad) > 5 else ''}</div>")
    if not rows:
        return (f"<div class='singlecard-live-view {NO_MATH_CLASSES}'><style>{_STYLE}</style>{head}"
                "<div class='scn-muted'>no step recorded yet</div></div>")
    th = "".join(f"<th data-col='{key}'>{escape(label)}</th>" for key, label, _ in COLUMNS)
    body = "".join(_cells(r, i) for i, r in enumerate(rows[:top], 1))
    more = (f"… {len(rows) - top} more rows (search to find one; all in insp.summary())"
            if len(rows) > top else "")
    render_id = f"{view_id}-{next(_renders)}"
    every = rows + flatten(rows)  # groups and their members: one numpy pass for all sparklines
    sparks = dict(zip(map(id, every), sparklines([r.history[-SPARK_STEPS:] for r in every])))
    data = {"view": view_id, "top": top, "numeric": {key: numeric for key, _, numeric in COLUMNS},
            "rows": [_record(r, i, sparks) for i, r in enumerate(rows, 1)]}
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False, default=_plain)
    payload = script_safe(payload)
    script = _SCRIPT.replace("GLOB", GLOB_JS).replace("RENDER_ID", render_id)
    return (f"<div class='singlecard-live-view {NO_MATH_CLASSES}' data-render='{render_id}'>"
            f"<style>{_STYLE}</style>{head}"
            "<div class='scn-controls'><input type='search' class='scn-search' "
            "placeholder='search module path or type: c_fc, h.9.*, LayerNorm' "
            "aria-label='search modules'>"
            "<label><input type='checkbox' class='scn-expand'> expand groups</label>"
            "<span class='scn-count scn-muted'></span></div>"
            f"<table class='singlecard-live'><thead><tr>{th}</tr></thead><tbody>{body}"
            f"</tbody></table><div class='scn-more scn-muted'>{escape(more)}</div>"
            f"<script type='application/json' class='scn-data'>{payload}</script>"
            f"<script>{script}</script></div>")


def script_safe(payload: str) -> str:
    """JSON that no HTML parser reads as markup inside a <script> element: a module named
    `<!--<script>` would otherwise turn the parser's script-escape states on, so that the
    element ends later than ours (the view's script never runs, and an nbconvert export hides
    all that follows). JSON reads \\u003c as `<`, so the data is the same."""
    return payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return num(value)
    return str(value)


# A search term with * ? or [ as a RegExp by fnmatch's rules (Python's search, ranking.search):
# `[` without its `]` is the character itself, `[!x]` is "not x", anything else is literal.
# None for a term the browser cannot compile (a range out of order): it matches nothing.
GLOB_JS = r"""
function globRe(t){var re="",i=0,n=t.length;
 while(i<n){var c=t[i++];
  if(c==="*")re+=".*";else if(c==="?")re+=".";
  else if(c==="["){var j=i;if(j<n&&t[j]==="!")j++;if(j<n&&t[j]==="]")j++;
   while(j<n&&t[j]!=="]")j++;
   if(j>=n){re+="\\[";continue;}
   var s=t.slice(i,j).replace(/\\/g,"\\\\").replace(/\]/g,"\\]");i=j+1;
   if(!s)re+="(?!)";else if(s==="!")re+=".";
   else{if(s[0]==="!")s="^"+s.slice(1);else if(s[0]==="^"||s[0]==="[")s="\\"+s;re+="["+s+"]";}}
  else re+=c.replace(/[.+^${}()|\\\/\]\[]/g,"\\$&");}
 try{return new RegExp("^(?:"+re+")$");}catch(e){return null;}}
""".strip()

# The browser side: reads the data, redraws the table from the user's state on every update.
_SCRIPT = r"""
(function(){
var roots=document.querySelectorAll(".singlecard-live-view[data-render='RENDER_ID']");
roots.forEach(function(root){
if(root.dataset.ready)return;root.dataset.ready="1";root.classList.add("scn-js");
var D=JSON.parse(root.querySelector(".scn-data").textContent);
var A=(window.__singlecardLive=window.__singlecardLive||{});
var st=A[D.view]||(A[D.view]={q:"",sort:null,dir:1,pins:[],open:[],expand:false,all:false,
 focus:false,caret:null});
var input=root.querySelector(".scn-search"),expand=root.querySelector(".scn-expand");
var tbody=root.querySelector("tbody"),more=root.querySelector(".scn-more");
var count=root.querySelector(".scn-count");
root.querySelector(".scn-controls").style.display="flex";
input.value=st.q;expand.checked=st.expand;
var ROW="singlecard-live-row";  // as the Python side draws rows, one per module or group
function esc(s){return String(s).replace(/[&<>"'$]/g,function(c){return "&#"+c.charCodeAt(0)+";";});}
GLOB
function key(r){return r.members?"g:"+r.name:r.module;}
function flat(rows){var out=[];rows.forEach(function(r){if(r.members)out.push.apply(out,r.members);else out.push(r);});return out;}
function matcher(q){
 var terms=q.toLowerCase().split(/[\s,]+/).filter(Boolean);
 var tests=terms.map(function(t){
  if(/[*?\[]/.test(t)){var re=globRe(t);return function(s){return re!==null&&re.test(s);};}
  return function(s){return s.indexOf(t)>=0;};});
 return function(r){var p=r.module.toLowerCase(),ty=r.type.toLowerCase();
  return tests.some(function(f){return f(p)||f(ty);});};}
function value(r,c){var v=r[c];if(!D.numeric[c])return String(v).toLowerCase();
 if(v==="nan")return Infinity;if(v==="inf")return Infinity;if(v==="-inf")return -Infinity;
 return typeof v==="number"?v:parseFloat(v);}
function compare(a,b){var c=st.sort,x=value(a,c),y=value(b,c);
 if(x<y)return -st.dir;if(x>y)return st.dir;return a.rank-b.rank;}
function cells(r,member){
 var sub=[];if(r.members&&!member)sub.push("worst: "+esc(r.module)+" · "+r.members.length+" modules");
 if(r.same)sub.push("same output: "+esc(r.same));
 var pinned=st.pins.indexOf(key(r))>=0,open=st.expand||st.open.indexOf(key(r))>=0;
 var toggle=r.members&&!member?"<span class='scn-toggle'>"+(open?"▾":"▸")+"</span>":"";
 var h="<tr class='"+ROW+" scn-t"+r.tier+(pinned?" scn-pinned":"")+(member?" scn-member":"")+
  "' data-key='"+esc(key(r))+"'><td class='p' title='pin this row to the top'>"+(pinned?"★":"☆")+
  "</td><td class='n'>"+r.rank+"</td><td class='m'>"+toggle+esc(member?r.module:r.name).replace(/\./g,".<wbr>")+
  sub.map(function(s){return "<div class='scn-sub'>"+s+"</div>";}).join("")+"</td><td>"+esc(r.type)+
  "</td><td>"+esc(r.shape)+"</td><td class='w'>"+esc(r.why)+"</td>";
 ["absmax","std","mean","zeros"].forEach(function(c){h+="<td class='n'>"+esc(r[c])+"</td>";});
 h+="<td class='n"+(r.nan?" bad":"")+"'>"+r.nan+"</td><td class='n"+(r.inf?" bad":"")+"'>"+r.inf+
  "</td><td class='s'>"+esc(r.trend)+"</td></tr>";
 if(r.members&&!member&&open)r.members.forEach(function(m){h+=cells(m,true);});
 return h;}
function draw(){
 var q=st.q.trim(),list=q?flat(D.rows).filter(matcher(q)):D.rows.slice();
 if(st.sort!==null)list.sort(compare);
 var every=D.rows.concat(flat(D.rows)),seen={},pins=[];
 every.forEach(function(r){var k=key(r);if(st.pins.indexOf(k)>=0&&!seen[k]){seen[k]=1;pins.push(r);}});
 list=list.filter(function(r){return !seen[key(r)];});
 var limit=st.all?list.length:Math.max(0,D.top-pins.length),shown=list.slice(0,limit);
 tbody.innerHTML=pins.concat(shown).map(function(r){return cells(r,false);}).join("");
 var rest=list.length-shown.length;
 more.innerHTML=rest>0?"… "+rest+" more rows · <a href='#' class='scn-all'>show all</a>":
  (st.all&&list.length>D.top?"<a href='#' class='scn-all'>show the first "+D.top+"</a>":"");
 count.textContent=q?list.length+" matching modules":"";
 root.querySelectorAll("th").forEach(function(th){var c=th.dataset.col,t=th.textContent.replace(/ [▲▼]$/,"");
  th.textContent=t+(c===st.sort?(st.dir>0?" ▲":" ▼"):"");});}
input.addEventListener("input",function(){st.q=input.value;st.caret=input.selectionStart;draw();});
input.addEventListener("focus",function(){st.focus=true;});
input.addEventListener("blur",function(){setTimeout(function(){if(root.isConnected)st.focus=false;},0);});
input.addEventListener("keydown",function(e){e.stopPropagation();});
expand.addEventListener("change",function(){st.expand=expand.checked;draw();});
root.addEventListener("click",function(e){
 var t=e.target,th=t.closest("th"),tr=t.closest("tr[data-key]");
 if(t.classList.contains("scn-all")){e.preventDefault();st.all=!st.all;draw();return;}
 if(th){var c=th.dataset.col;if(c==="pin")return;
  var first=D.numeric[c]&&c!=="rank"?-1:1;
  if(st.sort===c){if(st.dir===first)st.dir=-st.dir;else{st.sort=null;st.dir=1;}}
  else{st.sort=c;st.dir=first;}
  draw();return;}
 if(!tr)return;var k=tr.dataset.key;
 if(t.closest("td.p")){var i=st.pins.indexOf(k);if(i>=0)st.pins.splice(i,1);else st.pins.push(k);draw();}
 else if(t.classList.contains("scn-toggle")){var j=st.open.indexOf(k);if(j>=0)st.open.splice(j,1);else st.open.push(k);draw();}
});
draw();
if(st.focus){input.focus();if(st.caret!==null)input.setSelectionRange(st.caret,st.caret);}
});
})();
"""
