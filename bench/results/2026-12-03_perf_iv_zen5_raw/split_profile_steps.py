import json,collections,sys
t=json.load(open(sys.argv[1])); ev=t['traceEvents'] if isinstance(t,dict) else t
ev=[e for e in ev if e.get('ph')=='X' and e.get('cat')=='kernel']; ev.sort(key=lambda e:e['ts'])
steps=[]; cur=[]; prev_adam=False
for e in ev:
    adam = e['name']=='AdamW.step'
    if prev_adam and not adam: steps.append(cur); cur=[]
    cur.append(e); prev_adam=adam
steps.append(cur)
res={}
for label,sel in (('bf16',lambda s:any(e['name'].endswith('_bf16') for e in s)),('fp32',lambda s:not any(e['name'].endswith('_bf16') for e in s))):
    ss=[s for s in steps if len(s)>100 and sel(s)]
    tot=collections.Counter()
    for s in ss:
        for e in s: tot[e['name']+'/'+e['args'].get('kernel','')]+=e['args'].get('self_us',e['dur'])
    n=len(ss); res[label]={k:v/n for k,v in tot.items()}; res[label+'_n']=n
keys=sorted(set(res['bf16'])|set(res['fp32']), key=lambda k:-(res['fp32'].get(k,0)+res['bf16'].get(k,0)))
print('steps bf16 %d fp32 %d'%(res['bf16_n'],res['fp32_n']))
print('%-55s %8s %8s %8s'%('kernel','fp32','bf16','diff'))
for k in keys[:30]:
    a=res['fp32'].get(k,0); b=res['bf16'].get(k,0); print('%-55s %8.1f %8.1f %8.1f'%(k,a,b,b-a))
print('total', sum(res['fp32'].values()), sum(res['bf16'].values()))
