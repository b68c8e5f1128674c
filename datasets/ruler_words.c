/*
 * ruler_words.c -- kvsieve_datasets: the English word lists the RULER
 * generator draws from (word keys and values "adjective-noun" for the NIAH
 * tasks, the word pool of common-words extraction). Written for kvsieve
 * (plain dictionary words, one space between them); RULER draws the same
 * kinds of words from the wonderwords package, which kvsieve does not use.
 * Not here: the generator itself (ruler.c).
 */
#include "ruler_internal.h"

const char kvs_ruler_adjectives[] =
    "able absent acid active actual adult afraid agile alert alive amber ample ancient angry "
    "annual anxious aquatic arctic arid artful ashen aware awful basic beige bitter blank bleak "
    "blind blond blue bold bony boring brave brief bright brisk broad broken bronze brown bulky "
    "busy calm candid careful casual cheap cheerful chilly civic clean clear clever close cloudy "
    "coarse cold common complex cool copper cosmic costly cozy crafty crisp crude cruel curly "
    "curious cyan damp dapper dark dear decent deep dense direct dizzy double drab dry dual "
    "dusty eager early earthy easy elder elegant empty entire equal even exact exotic faint "
    "fair famous fancy far fast fatal fearless feeble fertile fierce filthy final fine firm "
    "flat fluffy foggy fond formal fragile frail free fresh friendly frosty frozen full funny "
    "fuzzy gentle giant gifted glad global glossy golden good graceful grand gray great green "
    "grim gritty gross hairy handy happy hardy harsh hasty heavy hidden high hollow honest "
    "hot huge humble humid hungry icy ideal idle inner instant ivory jagged jolly juicy keen "
    "kind large late lavish lazy lean legal level light likely limp little lively local lone "
    "long loose loud lovely loyal lucky lunar magic major mellow merry mild minor misty modern "
    "modest moist moral muddy mute narrow native neat nervous new nice nimble noble noisy "
    "normal novel odd old olive open orange oval pale perfect petty plain plastic pleasant "
    "plump polite poor precise pretty prime private proud pure purple quick quiet rapid rare "
    "raw ready real red regal remote rich rigid ripe rocky rosy rough round royal rural rustic "
    "sacred sad safe salty sandy scarlet secret serene shaggy sharp shiny short shy silent "
    "silky silver simple sleek slim slow small smart smooth snowy soft solar solid sour "
    "spare spicy splendid stable steady steep sticky stiff stout strange strict strong sturdy "
    "subtle sunny super sweet swift tall tame tart tender thick thin tidy tiny tough tropical "
    "true ugly upbeat urban usual vague valid vast velvet violet vital vivid warm wary weak "
    "wealthy weary wet white whole wide wild windy wise witty wooden young zealous";

const char kvs_ruler_nouns[] =
    "acorn actor airport album anchor angle ankle answer apple apron arch arm army arrow "
    "artist atlas attic aunt avenue baby badge bakery ball balloon banana band bank barn "
    "basket bath beach beam bean bear bed bee bell belt bench berry bicycle bird blanket "
    "blossom boat body bone book boot bottle bowl box brain branch bread brick bridge "
    "brother brush bucket bulb bus bush butter button cabin cable cactus cake camel camera "
    "camp canal candle canoe canyon cap captain car card carpet carrot cart castle cat cave "
    "ceiling cellar chain chair chalk channel cheese cherry chess chicken chimney church "
    "circle city clerk cliff clock closet cloud coach coal coast coat coffee coin collar "
    "comet compass cook copper corn cottage cotton couch country cousin cow crab crane "
    "crayon creek crow crown cup curtain cushion dancer daughter deer desert desk diamond "
    "dinner doctor dog doll dolphin donkey door dragon drawer dream dress drum duck eagle "
    "ear earth eel egg elbow elephant engine eye fabric face factory falcon farm farmer "
    "feather fence fern ferry field finger fire fish flag flame flock floor flower flute "
    "fog forest fork fountain fox frame friend frog fruit furnace garden garlic gate ghost "
    "giraffe glass glove goat gold goose grain grape grass guitar hall hammer hand harbor "
    "harp hat hawk heart hedge helmet hill hive honey hook horn horse hospital hotel house "
    "island jacket jar jelly jewel judge jungle kettle key king kitchen kite kitten knee "
    "knife ladder lake lamp lantern lawn leaf lemon letter library lily lion lizard lobster "
    "lock locket map marble market meadow melon mirror monkey moon morning moth mountain "
    "mouse mouth museum music nail needle nest net night noodle nose notebook nurse oak "
    "ocean office onion orchard otter oven owl painter palace pancake panda paper parade "
    "parcel park parrot path peach pear pebble pen pencil pepper piano picture pie pig "
    "pillow pilot pine pipe planet plate plum pocket poem pond pony potato puppet puzzle "
    "queen quilt rabbit radio rain ranch raven ribbon rice riddle ring river road robin "
    "rock rocket roof room rope rose sail sailor salad salmon sand school scissors sea "
    "seal seed shadow sheep shelf shell ship shirt shoe shop shore shovel singer sister "
    "sky sled snail snake soap sock sofa soldier song soup spider spoon spring square "
    "squirrel stable stair star station statue stone stove stream street string sugar "
    "suitcase summer sun swan sweater table tail teacher temple tent thread throne thunder "
    "tiger toast tomato tooth torch tower town toy tractor train tree truck trumpet tulip "
    "tunnel turtle umbrella valley vase village violin wagon wall walnut wave whale wheat "
    "wheel whistle window wing winter wizard wolf woods worm yacht yard zebra";

const char kvs_ruler_verbs[] =
    "accept admire agree allow answer appear argue arrange arrive attach attend bake "
    "balance bathe begin behave believe belong bend blink boil borrow bounce breathe build "
    "burn buy calculate call carry catch change chase cheer chew choose clap climb collect "
    "compare complain cook copy count cover crawl cross cry dance decide deliver describe "
    "design destroy develop dig discover divide draw dream drink drive drop earn eat "
    "enjoy enter escape examine expand explain explore fetch fill find fix float fly fold "
    "follow forgive gather giggle glow grab greet grow guard guess hang happen help hide "
    "hike hold hope hunt hurry imagine improve include inform invent invite jog join "
    "juggle jump kick kneel knit knock laugh launch learn lend lift listen look love "
    "manage march marry measure melt mix move notice obey offer open order organize paint "
    "pause pay perform pick plant play point polish pour pray prefer prepare press print "
    "promise protect pull push question race rain reach read relax remember repair repeat "
    "reply rescue rest return ride ring rise roll row run sail scrub search send serve "
    "sew shake share shine shout sing sink sit skate ski sleep slide smile sneeze solve "
    "sort speak spell spin splash stand stare start stay steer step stir stretch study "
    "swim talk taste teach thank think throw tickle travel trust try turn twist type "
    "understand unlock visit wait walk wander want wash watch wave weave whisper win "
    "wink wish wonder work worry write yawn yell";
