/* srv_ui.c — the server's live view: GET /store.json (the routed experts' tiers, df_model_expert_map) and GET /
 * (one self-contained HTML page, no external assets, that polls /health, /metrics and /store.json every 2 s and
 * draws the expert store as a grid of layers x experts beside plots of the serving rates). */
#include "srv.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *srv_store_json(srv_backend *be, int *http_status) {
    srv_buf b;
    srv_buf_init(&b);
    int nl = 0, ne = 0;
    if (!be->expert_map || be->expert_map(be, NULL, NULL, 0, &nl, &ne, NULL) <= 0) {
        *http_status = 200;
        srv_buf_printf(&b, "{\"object\":\"expert_map\",\"moe_layers\":0,\"experts\":0,\"layers\":[]}");
        return b.p;
    }
    const size_t n = (size_t)nl * (size_t)ne;
    unsigned char *st = malloc(n);
    float *heat = malloc(sizeof(float) * n);
    int *ids = malloc(sizeof(int) * (size_t)nl);
    if (!st || !heat || !ids || be->expert_map(be, st, heat, (int)n, &nl, &ne, ids) != (int)n) {
        free(st); free(heat); free(ids); srv_buf_free(&b);
        *http_status = 500;
        return srv_error_json("The expert map could not be read.", "server_error", NULL, NULL);
    }
    float hmax = 0;
    for (size_t i = 0; i < n; i++) if (heat[i] > hmax) hmax = heat[i];
    static const char hex[] = "0123456789abcdef";
    srv_buf_printf(&b, "{\"object\":\"expert_map\",\"moe_layers\":%d,\"experts\":%d,\"heat_max\":%.6g,"
                       "\"legend\":{\"state\":\"digit per expert: 0 drives only, 1 being read, 2 host cache; +4 in GPU "
                       "memory\",\"heat\":\"two hex digits per expert: eviction score / heat_max x 255\"},\"layers\":[",
                   nl, ne, hmax);
    char *line = malloc((size_t)ne * 2 + 1);
    for (int l = 0; l < nl && line; l++) {
        const unsigned char *s = st + (size_t)l * ne;
        const float *h = heat + (size_t)l * ne;
        srv_buf_printf(&b, "%s{\"layer\":%d,\"state\":\"", l ? "," : "", ids[l]);
        for (int e = 0; e < ne; e++) line[e] = (char)('0' + (s[e] & 7));
        srv_buf_add(&b, line, (size_t)ne);
        srv_buf_adds(&b, "\",\"heat\":\"");
        for (int e = 0; e < ne; e++) {
            int q = hmax > 0 ? (int)(h[e] / hmax * 255.0f + 0.5f) : 0;
            q = q > 255 ? 255 : q < 0 ? 0 : q;
            line[2 * e] = hex[q >> 4];
            line[2 * e + 1] = hex[q & 15];
        }
        srv_buf_add(&b, line, (size_t)ne * 2);
        srv_buf_adds(&b, "\"}");
    }
    srv_buf_adds(&b, "]}");
    free(line); free(st); free(heat); free(ids);
    *http_status = 200;
    return b.p;
}

const char *srv_ui_html(void) {
    return
"<!doctype html><html><head><meta charset=\"utf-8\"><title>deltafin</title>\n"
"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\n"
"<style>body{font:13px system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}h1{font-size:18px;margin:0 0 4px}"
".sub{color:#666;margin-bottom:12px}.row{display:flex;flex-wrap:wrap;gap:12px}.card{background:#fff;border:1px solid #ddd;"
"border-radius:6px;padding:8px 10px}.card h2{font-size:13px;margin:0 0 4px;font-weight:600}.big{font-size:20px}"
"canvas{display:block}#grid{image-rendering:pixelated;border:1px solid #ccc;background:#333}.lg span{display:inline-block;"
"width:10px;height:10px;margin:0 3px 0 10px;vertical-align:middle}#err{color:#b00}</style></head><body>\n"
"<h1>deltafin <span id=\"model\"></span></h1><div class=\"sub\" id=\"info\">connecting...</div><div id=\"err\"></div>\n"
"<div class=\"row\" id=\"plots\"></div>\n"
"<div class=\"card\" style=\"margin-top:12px\"><h2>Expert store: MoE layers (rows) x routed experts (columns), now</h2>\n"
"<div class=\"lg\"><span style=\"background:#333\"></span>on the drives only<span style=\"background:#e0b000\"></span>being read"
"<span style=\"background:#2a6fdb\"></span>host cache (brighter = hotter)<span style=\"background:#1aa35a\"></span>GPU memory"
"</div><div id=\"tiers\" style=\"margin:4px 0\"></div><canvas id=\"grid\"></canvas></div>\n"
"<script>\n"
"const P=[['gen','generated tok/s',d=>d.r('deltafin_generation_tokens_total')],"
"['prompt','prompt tok/s',d=>d.r('deltafin_engine_prefill_tokens_total')],"
"['hit','expert hit rate %',d=>{const h=d.d('deltafin_expert_hits_total'),m=d.d('deltafin_expert_misses_total');return h+m>0?100*h/(h+m):null}],"
"['read','expert reads MB/s',d=>d.r('deltafin_expert_read_bytes_total')/1e6],"
"['stall','I/O stall % (summed over generations)',d=>100*d.r('deltafin_io_stall_seconds_total')],"
"['req','requests running / waiting',d=>d.v('deltafin_requests_running')-d.v('deltafin_requests_waiting')]];\n"
"const H={},N=150;let prev=null;\n"
"function parse(t){const m={};for(const l of t.split('\\n')){if(!l||l[0]=='#')continue;const i=l.lastIndexOf(' ');"
"const k=l.slice(0,i),b=k.indexOf('{'),n=b<0?k:k.slice(0,b);m[n]=(m[n]||0)+parseFloat(l.slice(i+1));}return m}\n"
"for(const [id,t] of P){H[id]=[];document.getElementById('plots').insertAdjacentHTML('beforeend',"
"`<div class=card><h2>${t}</h2><div class=big id=v_${id}>-</div><canvas id=c_${id} width=260 height=70></canvas></div>`)}\n"
"function draw(id){const c=document.getElementById('c_'+id),g=c.getContext('2d'),a=H[id];g.clearRect(0,0,c.width,c.height);"
"const v=a.filter(x=>x!=null);if(!v.length)return;const mx=Math.max(1e-9,...v);g.strokeStyle='#2a6fdb';g.beginPath();"
"a.forEach((x,i)=>{if(x==null)return;const X=i*c.width/(N-1),Y=c.height-2-(c.height-4)*x/mx;i?g.lineTo(X,Y):g.moveTo(X,Y)});"
"g.stroke();g.fillStyle='#888';g.fillText(mx.toPrecision(3),2,10)}\n"
"async function tick(){try{const [h,m,s]=await Promise.all([fetch('/health').then(r=>r.json()),"
"fetch('/metrics').then(r=>r.text()),fetch('/store.json').then(r=>r.json())]);document.getElementById('err').textContent='';\n"
"document.getElementById('model').textContent=h.model+(h.exact?' (exact)':' (NOT EXACT)');\n"
"document.getElementById('info').textContent=`status ${h.status}, in flight ${h.in_flight}, waiting ${h.waiting}, parallel ${h.parallel}, served ${h.served}, rejected ${h.rejected}`;\n"
"const cur={t:performance.now()/1e3,m:parse(m)};if(prev){const dt=cur.t-prev.t;"
"const d={d:k=>(cur.m[k]||0)-(prev.m[k]||0),r:k=>((cur.m[k]||0)-(prev.m[k]||0))/dt,v:k=>cur.m[k]||0};\n"
"for(const [id,,f] of P){const x=f(d);H[id].push(x);if(H[id].length>N)H[id].shift();"
"document.getElementById('v_'+id).textContent=id=='req'?`${d.v('deltafin_requests_running')-d.v('deltafin_requests_waiting')} / ${d.v('deltafin_requests_waiting')}`:"
"(x==null?'-':x.toFixed(id=='hit'||id=='stall'?1:2));draw(id)}}prev=cur;grid(s)}catch(e){document.getElementById('err').textContent='not reachable: '+e}}\n"
"function grid(s){const c=document.getElementById('grid'),L=s.moe_layers,E=s.experts;if(!L){c.width=c.height=0;"
"document.getElementById('tiers').textContent='no routed experts';return}const px=Math.max(2,Math.min(12,Math.floor(1100/E)));"
"c.width=E*px;c.height=L*px;const g=c.getContext('2d');const n=[0,0,0,0];\n"
"s.layers.forEach((ly,r)=>{for(let e=0;e<E;e++){const st=+ly.state[e],hv=parseInt(ly.heat.substr(2*e,2),16)/255;let col='#333';"
"if(st&4){col='#1aa35a';n[3]++}else if((st&3)==2){const b=Math.round(90+165*hv);col=`rgb(${Math.round(b*0.16)},${Math.round(b*0.44)},${b})`;n[2]++}"
"else if((st&3)==1){col='#e0b000';n[1]++}else n[0]++;g.fillStyle=col;g.fillRect(e*px,r*px,px-(px>3),px-(px>3))}});\n"
"document.getElementById('tiers').textContent=`${L} layers x ${E} experts: drives only ${n[0]}, being read ${n[1]}, host cache ${n[2]}, GPU ${n[3]}`}\n"
"tick();setInterval(tick,2000);\n"
"</script></body></html>\n";
}
