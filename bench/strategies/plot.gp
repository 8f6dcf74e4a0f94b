# The strategies benchmark's figure (bench/strategies/run.sh draws it):
#   gnuplot -e "datadir='build/bench/strategies'; out='strategies.png'" bench/strategies/plot.gp
# One row of panels per config: the per-rank memory split of each strategy as stacked
# bars (params, grads, optimizer, activations), and its tokens/s, one bar per precision.
# run.sh writes the data: datadir/plot-CONFIG.dat (a row per strategy: label, four MiB
# columns, then tokens/s per precision) and datadir/plot-vars.gp (n, cfg[], the titles,
# precs[]: the precisions of the tokens/s columns).
if (!exists("datadir") || !exists("out")) {
    print "plot.gp: set datadir and out (gnuplot -e \"datadir='DIR'; out='FILE.png'\")"
    exit status 2
}
load datadir . '/plot-vars.gp'

set terminal pngcairo size 1300, 430 * n font ',10'
set output out
set datafile missing '?'
set style data histograms
set style fill solid 0.85 border -1
set boxwidth 0.75
set grid ytics
set key outside right top vertical
set yrange [0:*]
set multiplot layout n, 2

do for [i = 1:n] {
    f = sprintf('%s/plot-%s.dat', datadir, cfg[i])
    set title mem_title[i]
    set ylabel 'MiB per rank'
    set style histogram rowstacked
    plot f using 2:xtic(1) title 'params' lc rgb '#4477aa', \
         '' using 3 title 'grads' lc rgb '#66ccee', \
         '' using 4 title 'optimizer' lc rgb '#228833', \
         '' using 5 title 'activations' lc rgb '#ccbb44'

    set title tps_title[i]
    set ylabel 'tokens/s (all ranks)'
    set style histogram clustered gap 1
    np = words(precs[i])
    plot for [k = 1:np] f using (column(5 + k)):xtic(1) title word(precs[i], k) lc rgb word('#4477aa #ee6677', k)
}
unset multiplot
