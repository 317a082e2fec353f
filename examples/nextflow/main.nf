#!/usr/bin/env nextflow
// Scatter a multi-record FASTA over N `evspark generate --shard i/N` tasks and gather the
// results: the Nextflow counterpart of examples/Snakefile, through the nf-core-style module in
// modules/evspark/generate.
//
//   nextflow run examples/nextflow/main.nf --input genomes.fa --shards 8 --n_tokens 4096
//   nextflow run examples/nextflow/main.nf -stub-run --input examples/prompts.fa   # wiring only
//
// Record k goes to shard (k mod N) + 1 and its random stream depends only on its id and the
// seed, so results/generated.fa holds the records of one unsharded run (in shard order).
nextflow.enable.dsl = 2

params.input    = "${projectDir}/../prompts.fa"
params.shards   = 4
params.n_tokens = 1024
params.seed     = 0
params.model    = ''
params.server   = ''   // a running `evspark serve` URL: every shard decodes there
params.extra    = ''
params.outdir   = 'results'

include { EVSPARK_GENERATE } from './modules/evspark/generate/main'

workflow {
    if ((params.shards as int) < 1) {
        error "shards must be >= 1, got ${params.shards}"
    }
    if (params.server && params.model) {
        error "set model or server, not both: a server decodes with its own model"
    }
    fasta = file(params.input, checkIfExists: true)
    shards = Channel.of(1..(params.shards as int)).map { i ->
        [ [ id: "shard${i}", shard: "${i}/${params.shards}" ], fasta ]
    }
    model = params.model ? file(params.model, checkIfExists: true) : []

    EVSPARK_GENERATE(shards, model)

    // gather in shard order (1, 2, ..., 10: by number, not by name): the FASTA concatenated,
    // the stats with one header row
    def shard_number = { f -> (f.name =~ /^shard(\d+)\./)[0][1] as int }
    EVSPARK_GENERATE.out.fasta
        .map { meta, f -> f }
        .collectFile(name: 'generated.fa', storeDir: params.outdir, sort: shard_number)
    EVSPARK_GENERATE.out.stats
        .map { meta, f -> f }
        .collectFile(name: 'stats.tsv', storeDir: params.outdir, keepHeader: true, skip: 1,
                     sort: shard_number)
    EVSPARK_GENERATE.out.log
        .map { meta, f -> f }
        .collectFile(storeDir: "${params.outdir}/logs")
}
