import sys; sys.path.insert(0,'bench')
import numpy as np
from collections import defaultdict
from corun_rounds import Pricer, decode_rounds, BUSY
from fit_host_costs import timed_points
import split_batches as sb
from pdmux_triton.cost.measured_inputs import load_host_costs
HC='bench/results/host-costs-h200.json'; CAL='bench/results/calibrate-h200.json'; CMP='bench/results/compare-h200.json'
path='bench/results/trace-fidelity/points-h200.jsonl'
ov=load_host_costs(HC)
for kind, strat in (("grid_cap","pdmux_grid_cap"),("green","pdmux_green")):
    pricer=Pricer(path,CAL,CMP,ov,'h200',kind)
    rows=[]; drows=[]
    for point, host_s in timed_points(path):
        if point['strategy']!=strat: continue
        up=ov.on_host(host_s).split_prefill_batch_s()
        r=sb.split_batches(point, sb.point_requests(path, point, pricer), pricer, up)
        if r is None: print('left out', point.get('trace'), point.get('start'), point.get('rate')); continue
        rows+= [dict(x, where=(point.get('start'), point.get('rate'))) for x in r]
        if 'busy_us' in point['diagnostics']:
            drows += [x for x in decode_rounds(point, pricer, strat) if x['corun']]
    print(kind, 'batches', len(rows))
    by=defaultdict(list)
    for x in rows:
        if x['tokens']>=sb.MIN_TOKENS and x['busy']>=sb.MIN_BUSY and x['seconds']>0:
            by[x['prefill_sms']].append(x['corun_s']/x['seconds'])
    for k,v in sorted(by.items()): print('  sms',k,'n',len(v),'median %.3f'%np.median(v), 'p25 %.3f p75 %.3f'%tuple(np.percentile(v,[25,75])))
    by=defaultdict(list)
    for x in rows:
        if x['tokens']>=2048 and x['seconds']>0:
            by[(x['prefill_sms'], x['busy']>=0.9)].append(x['corun_s']/x['seconds'])
    for k,v in sorted(by.items()): print('  >=2048 sms,busy',k,'n',len(v),'median %.3f'%np.median(v))
    g=defaultdict(list)
    for x in drows: g[int(np.digitize(x['busy'],BUSY))].append(x)
    for b,xs in sorted(g.items()):
        print('  decode busy bin',b,'n',len(xs),'busy %.2f'%np.median([x['busy'] for x in xs]),'ratio(no busy term) %.3f'%np.median([x['measured_ms']/x['price_ms'] for x in xs]))
