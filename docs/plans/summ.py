import re,sys
def parse(path):
    txt=open(path).read()
    res={}
    mode=None
    for block in re.split(r'\n(?====== MODE|### )',txt):
        if block.startswith('===== MODE'):
            mode='custom' if 'custom' in block.split('\n')[0] else 'generic'
            continue
        if not block.startswith('### '): continue
        name=block.split('\n')[0][4:].strip()
        lines=block.split('\n')[1:]
        pages=0; first=True
        for l in lines:
            m=re.search(r'Buffers: (.*)',l)
            if m and first and not l.strip().startswith('Planning'):
                # top buffers
                for k,v in re.findall(r'(hit|read|dirtied|written)=(\d+)',m.group(1)):
                    if k in('hit','read'): pages+=int(v)
                first=False
        # planning buffers are separate lines "Planning:" then Buffers; skip those: crude: stop at 'Planning:'
        body=[]
        for l in lines:
            if l.strip().startswith('Planning:'): break
            body.append(l)
        pages=0
        for l in body:
            m=re.search(r'Buffers: (.*)',l)
            if m:
                for k,v in re.findall(r'(hit|read)=(\d+)',m.group(1)): pages+=int(v)
                break
        scans=[]
        for l in body:
            m=re.search(r'((?:Parallel )?(?:Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan|Bitmap Index Scan|Hash Join|Nested Loop|Merge Join|Function Scan)(?: using \S+)?(?: on \S+)?)',l)
            if m: scans.append(m.group(1).replace('Function Scan on ','fn '))
        removed=sum(int(x) for x in re.findall(r'Rows Removed by (?:Filter|Join Filter|Index Recheck): (\d+)',"\n".join(body)))
        err='ERROR' if 'ERROR' in block else ''
        res[(name,mode)]=(pages,removed,scans,err)
    return res
files=sys.argv[1:]
data=[parse(f) for f in files]
keys=[]
for d in data:
    for k in d:
        if k not in keys: keys.append(k)
for k in keys:
    row=[f"{k[0]} [{k[1]}]"]
    for d in data:
        v=d.get(k)
        if v is None: row.append('-'); continue
        pages,removed,scans,err=v
        sc=', '.join(dict.fromkeys(s for s in scans if not s.startswith('fn ') and not s in('Nested Loop','Hash Join','Merge Join')))
        row.append(f"{pages}p rm={removed} {sc} {err}")
    print(' | '.join(row))
